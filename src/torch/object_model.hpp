// Torch object model: the PickleHooks that turn allowlisted globals into
// values, tensors and storages, with torch's weights-only rules.
//
// Accepted (everything else is refused with a policy error):
//  1. GLOBAL: names in the Allowlist; modules sys/os/posix/nt always refused.
//     dtypes and qschemes become kDtype/kQScheme values; others kGlobal.
//  2. REDUCE on: OrderedDict(), OrderedDict([(k, v), ...]), Counter(),
//     Counter(dict), set([...]), frozenset([...]), bytearray(), bytearray(bytes),
//     bytearray(str, 'latin-1'), complex(re, im), slice(a[, b[, c]]),
//     _codecs.encode(str, 'latin1'|'latin-1'), torch.Size((ints)),
//     torch.device(type[, index]), _get_layout(name), the rebuild functions of
//     torch/_utils.py (§5.3), _rebuild_from_type_v2 with torch.Tensor /
//     Parameter types, numpy reconstruct/scalar/dtype (when allowlisted), and
//     any other allowlisted callable as a generic kObject (never executed).
//  3. NEWOBJ: nn.Parameter(data[, requires_grad]) and user-allowlisted classes
//     (torch: "Can only create new object for nn.Parameter or classes
//     allowlisted via add_safe_globals").
//  4. BUILD: OrderedDict with a dict state (sets attributes, e.g. _metadata),
//     generic objects of user-allowlisted classes, numpy dtype/ndarray states.
//  5. BINPERSID: ("storage", storage_type, key, location, numel) — 5-tuple for
//     zip files, 6-tuple with view_metadata None for the legacy format;
//     storage_type a legacy storage class or UntypedStorage; key str (bytes
//     decoded as ASCII); numel >= 0. Storages are resolved by a
//     StorageProvider (the container layer) and shared per key.
// What 2-4 decide without looking at arguments (which globals REDUCE and
// NEWOBJ may call, which targets BUILD may update) is weights_only_rules.hpp,
// the scanner's rules too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "safeckpt/allowlist.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/pickle.hpp"
#include "safeckpt/tensor.hpp"

namespace safeckpt {

struct TorchTables {
  std::vector<TensorInfo> tensors;
  std::vector<StorageInfo> storages;
  // Bytes of storages decoded from the pickle itself (numpy arrays).
  std::vector<std::shared_ptr<std::vector<std::uint8_t>>> owned;
};

class StorageProvider {
 public:
  virtual ~StorageProvider() = default;
  // Returns the index in TorchTables::storages of the storage `key`, adding it
  // on first use. nbytes = numel x dtype_size(dtype) as the pid declares.
  // Errors: kMalformed (record missing or of another size), kLimitExceeded.
  virtual Result<std::uint32_t> storage(std::string_view key, DType dtype, std::uint64_t nbytes,
                                        std::string_view location, const OpContext& ctx) = 0;
};

enum class PidForm : std::uint8_t { kZip, kLegacy };

class TorchHooks final : public PickleHooks {
 public:
  TorchHooks(ValueArena& arena, TorchTables& tables, const Allowlist& allowlist, StorageProvider* provider,
             const Limits& limits, PidForm pid_form)
      : arena_(arena), t_(tables), allow_(allowlist), provider_(provider), lim_(limits), pid_form_(pid_form) {}

  Result<NodeId> resolve_global(std::string_view qualname, const OpContext& ctx) override;
  Result<NodeId> call(NodeId callable, NodeId args, const OpContext& ctx) override;
  Result<NodeId> new_object(NodeId cls, NodeId args, const OpContext& ctx) override;
  Status build(NodeId obj, NodeId state, const OpContext& ctx) override;
  Result<NodeId> persistent_load(NodeId pid, const OpContext& ctx) override;
  Status require_builtin(std::string_view qualname, const OpContext& ctx) override;

 private:
  const AllowEntry* entry_of(NodeId global) const;
  // Containers built by copying (OrderedDict(d), Counter(d), set(l), Size(t))
  // count their items against limits.max_nodes, so copying one memoized
  // container many times cannot amplify memory (fuzz/regressions/pickle_torch).
  Status charge_items(std::size_t n);
  Result<NodeId> add(Node n);
  Result<NodeId> add_tensor(TensorInfo t);
  // Charges the run's MemoryBudget (OpContext::budget of the hook call in
  // progress) for side tables: tensor metadata, numpy array buffers.
  Status charge(std::uint64_t bytes, const char* what);
  Status charge_tensor(const TensorInfo& t);
  Result<NodeId> rebuild_strided(const std::vector<NodeId>& a, Builtin which);
  Result<NodeId> rebuild_parameter(const std::vector<NodeId>& a, bool with_state);
  Result<NodeId> rebuild_qtensor(const std::vector<NodeId>& a);
  Result<NodeId> rebuild_sparse(const std::vector<NodeId>& a);
  Result<NodeId> rebuild_meta(const std::vector<NodeId>& a);
  Result<NodeId> rebuild_from_type_v2(const std::vector<NodeId>& a, const OpContext& ctx);
  Result<NodeId> rebuild_dtensor(const std::vector<NodeId>& a);  // src/torch/dtensor.cpp
  Result<NodeId> rebuild_device_from_cpu(const std::vector<NodeId>& a);
  Result<NodeId> make_set(Kind kind, const std::vector<NodeId>& a);
  Result<NodeId> make_device(const std::vector<NodeId>& a);
  Result<NodeId> numpy_call(Builtin b, NodeId callable, const std::vector<NodeId>& a);
  Status numpy_build(NodeId obj, NodeId state);
  Status check_view(const TensorInfo& t, std::uint64_t storage_nbytes) const;

  ValueArena& arena_;
  TorchTables& t_;
  const Allowlist& allow_;
  StorageProvider* provider_;
  const Limits& lim_;
  PidForm pid_form_;
  // numpy objects under construction: dtype descriptors (code, byte order)
  // and arrays awaiting their BUILD state.
  struct NumpyState {
    bool is_array = false;
    std::string code;  // dtype code, e.g. "f8" (dtypes)
    char order = '=';  // byte order from the dtype's BUILD state
  };
  std::unordered_map<NodeId, NumpyState> numpy_objects_;
  std::uint64_t copied_items_ = 0;
  MemoryBudget* budget_ = nullptr;  // of the hook call in progress (OpContext::budget)
};

}  // namespace safeckpt
