"""A tensor subclass for gen_tensor_subclass.py (PyTorch's add_safe_globals([MyTensor]) case)."""
import torch


class MyTensor(torch.Tensor):
    pass
