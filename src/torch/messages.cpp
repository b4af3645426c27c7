// allow_hint: the message of a refused global (safeckpt/allowlist.hpp).
#include <string>

#include "torch/hook_args.hpp"
#include "torch/object_model.hpp"

namespace safeckpt {

std::string allow_hint(std::string_view g) {
  std::string name(g);
  if (Allowlist::is_blocked(g))
    return "Unsupported global: GLOBAL " + name + " is " + Allowlist::blocked_reason(g) +
           ". This file tries to run code when unpickled; safeckpt refuses it always (it cannot be allowlisted). "
           "Do not load this file with torch.load(weights_only=False).";
  if (const DangerousGlobal* d = find_dangerous_global(g); d != nullptr && is_known_dangerous(g))
    return "Unsupported global: GLOBAL " + name + " is a known-dangerous callable (" + std::string(d->category) + ": " +
           std::string(d->why) +
           "). This file tries to run code (or build objects the weights-only rules forbid) when unpickled; do "
           "not allowlist it and do not load it with torch.load(weights_only=False).";
  // numpy values: the shipped numpy.allow rebuilds arrays as tensors; a plain
  // line would turn them into opaque objects.
  bool numpy_value = g.rfind("numpy.dtypes.", 0) == 0;
  for (std::string_view n :
       {"numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct", "numpy._core.multiarray.scalar",
        "numpy.core.multiarray.scalar", "numpy.ndarray", "numpy.dtype"})
    numpy_value = numpy_value || g == n;
  if (numpy_value)
    return "Unsupported global: GLOBAL " + name +
           " was not an allowed global by default (PyTorch's weights-only set). The file holds numpy arrays "
           "or scalars: if you trust it, load it with `--allow numpy` (the bundled allowlist/numpy.allow, "
           "installed in <prefix>/share/safeckpt/allowlist/; it rebuilds arrays as tensors and scalars as "
           "numbers) or Allowlist::add_file(<that file>).";
  // DTensors in a torch.save file (torch.save(model.state_dict()) of an FSDP2
  // / DTensor model; tests/data/dcp-2.11/*/ranks/, README there): PyTorch
  // 2.11 loads them only after `import torch.distributed.tensor` registers
  // DTensor, DeviceMesh, DTensorSpec, TensorMeta, ShardOrderEntry, Shard,
  // Replicate, Partial as safe globals; our equivalent is the bundled
  // allowlist/dtensor.allow (src/torch/dtensor.cpp models those classes).
  for (std::string_view prefix :
       {"torch.distributed.tensor.", "torch.distributed.device_mesh.", "torch.distributed._mesh_layout."})
    if (g.rfind(prefix, 0) == 0)
      return "Unsupported global: GLOBAL " + name +
             " is part of a DTensor (torch.distributed.tensor). This file is a torch.save of a sharded "
             "(FSDP2 / DTensor) state_dict: each tensor is one rank's local shard plus its device mesh and "
             "placements. PyTorch loads it only after `import torch.distributed.tensor`; safeckpt with "
             "`--allow dtensor` (the bundled allowlist/dtensor.allow: each DTensor as its local shard with "
             "its mesh and placements, nothing of the classes is run). `safeckpt convert --rank R0.pt --rank "
             "R1.pt ... OUT` gathers every rank's file into full tensors; a torch.distributed.checkpoint "
             "directory (inspect, scan, convert DIR, load_dcp) is the better way to save sharded models.";
  // Bundled allowlists that cover a global: name them (`--allow NAME`).
  std::string bundled;
  if (g == "builtins.frozenset" || g == "builtins.slice")
    bundled = " The bundled `--allow python_values` allows frozenset and slice.";
  else if (g == "argparse.Namespace")
    bundled = " The bundled `--allow argparse` allows it.";
  return "Unsupported global: GLOBAL " + name +
         " was not an allowed global by default (PyTorch's weights-only set). If you trust this file, "
         "allow it with `--allow FILE` (a line `" +
         name + "`), `--allow " + name + "` or Allowlist::add(\"" + name +
         "\") — the equivalent of torch.serialization.add_safe_globals([" + name + "])." + bundled;
}

}  // namespace safeckpt
