// fuzz/fuzz_allowlists.hpp — the allowlists the harnesses choose between:
// PyTorch's default weights-only set, or that set plus user entries (the
// add_safe_globals paths: generic objects, NEWOBJ/BUILD on user classes,
// `= known.name` aliases, numpy and Python values, DTensors).
#pragma once

#include "fuzz_util.hpp"
#include "safeckpt/allowlist.hpp"

namespace safeckpt::fuzz {

inline const Allowlist& extended_allowlist() {
  static const Allowlist list = [] {
    Allowlist a = Allowlist::default_policy();
    struct Add {
      const char* name;
      const char* as;
    };
    static constexpr Add kAdds[] = {
        {"argparse.Namespace", ""},
        {"builtins.frozenset", ""},
        {"builtins.slice", ""},
        {"numpy._core.multiarray._reconstruct", ""},
        {"numpy._core.multiarray.scalar", ""},
        {"numpy.ndarray", ""},
        {"numpy.dtype", ""},
        {"fuzz.Obj", ""},
        {"fuzz.Rebuild", "torch._utils._rebuild_tensor_v2"},
        {"fuzz.Sub", "torch.Tensor"},
        {"fuzz.Param", "torch.nn.parameter.Parameter"},
        {"fuzz.OD", "collections.OrderedDict"},
        // allowlist/dtensor.allow: DTensors in torch.save files (src/torch/dtensor.cpp).
        {"torch.distributed.tensor.DTensor", ""},
        {"torch.distributed.tensor._dtensor_spec.DTensorSpec", ""},
        {"torch.distributed.tensor._dtensor_spec.TensorMeta", ""},
        {"torch.distributed.tensor._dtensor_spec.ShardOrderEntry", ""},
        {"torch.distributed.device_mesh.DeviceMesh", ""},
        {"torch.distributed._mesh_layout._MeshLayout", ""},
        {"torch.distributed.tensor.placement_types.Shard", ""},
        {"torch.distributed.tensor.placement_types.Replicate", ""},
        {"torch.distributed.tensor.placement_types.Partial", ""},
    };
    for (const Add& e : kAdds) {
      auto st = a.add(e.name, e.as, "fuzz");
      FUZZ_REQUIRE(st.has_value(), "cannot build the fuzz allowlist: " + st.error().to_string());
    }
    return a;
  }();
  return list;
}

inline const Allowlist& pick_allowlist(bool extended) {
  return extended ? extended_allowlist() : Allowlist::default_policy();
}

}  // namespace safeckpt::fuzz
