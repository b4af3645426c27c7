# Generates odd_keys.pt for tests/cli/test_cli_inspect.cpp (the inspect text
# view shows values under dict keys that are not str/int). Run with Debian's
# PyTorch 1.13: /usr/bin/python3 gen_inspect_keys.py
import torch

torch.manual_seed(0)
obj = {
    "w": torch.arange(4, dtype=torch.float32),
    "by_pair": {(1, 2): torch.ones(2, dtype=torch.int64), (3, 4): "second"},
    "by_bool": {True: 7},
    "by_none": {None: "nothing"},
}
torch.save(obj, "odd_keys.pt")
back = torch.load("odd_keys.pt", weights_only=True)
print(back)
