// PyTorch checkpoint -> safetensors (safetensors_writer.hpp, ToSafetensorsOptions).
//
// Walk (explicit stack, depth-first, in order): dicts/OrderedDicts with str
// or int keys and lists/tuples are descended, their entries named by dotted
// path like Checkpoint::state_dict(); tensors become safetensors tensors;
// every other value, or a container holding no tensor, becomes one
// __metadata__ entry (compact JSON) when it is plain data (None, bool, int,
// float, str, torch.Size/dtype/device, lists/tuples/str-keyed dicts of
// those). A state_dict's `_metadata` (module versions) is dropped with a note.
// Hostile trees: each container is descended once (shared ones are noted),
// JSON sizes are computed once bottom-up (JsonSizes), and names are capped at
// kMaxTensorNameBytes (kLimitExceeded), so the work is linear in the tree.
#include <algorithm>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "safeckpt/json.hpp"
#include "safeckpt/safetensors_writer.hpp"
#include "safetensors/internal.hpp"
#include "util/bytes.hpp"

namespace safeckpt {
namespace {

Unexpected unsupported(std::string msg) {
  return make_error(ErrorCode::kUnsupported, "safetensors: " + std::move(msg));
}

// JSON string of `s`: every control character as \u00xx.
std::string json_quote(std::string_view s) {
  std::string out;
  util::append_json_string(out, s, util::JsonControls::kUnicode);
  return out;
}

struct Encoded {
  std::string text;
  bool has_tensor = false;
  std::string unrepresentable;  // kind name of the first value JSON cannot hold
};

// Compact JSON of the value at `root`, iteratively; stops early at a tensor
// (has_tensor), at a value JSON cannot hold, or past `budget` bytes.
Encoded encode(const ValueArena& a, NodeId root, std::uint64_t budget) {
  Encoded e;
  struct Frame {
    NodeId id;
    std::size_t next;
  };
  std::vector<Frame> st{{root, 0}};
  std::unordered_set<NodeId> on_path;
  auto scalar = [&](const Node& n) -> bool {
    switch (n.kind) {
      case Kind::kNone: e.text += "null"; return true;
      case Kind::kBool: e.text += n.flag ? "true" : "false"; return true;
      case Kind::kInt: e.text += std::to_string(n.i); return true;
      case Kind::kBigInt: e.text += n.text; return true;
      case Kind::kFloat: {
        std::string r = python_float_repr(n.re);
        if (r == "nan" || r == "inf" || r == "-inf")
          e.text += json_quote(r);
        else
          e.text += r;
        return true;
      }
      case Kind::kStr:
        if (!util::valid_utf8(n.text)) {
          e.unrepresentable = "str (not valid UTF-8)";
          return false;
        }
        e.text += json_quote(n.text);
        return true;
      case Kind::kDtype: e.text += json_quote("torch." + n.text); return true;
      case Kind::kDevice: e.text += json_quote(n.text); return true;
      default: e.unrepresentable = std::string(kind_name(n.kind)); return false;
    }
  };
  while (!st.empty()) {
    if (e.text.size() > budget) return e;
    Frame& f = st.back();
    const Node& n = a[f.id];
    const bool is_dict = n.kind == Kind::kDict || n.kind == Kind::kOrderedDict;
    const bool is_seq = n.kind == Kind::kList || n.kind == Kind::kTuple || n.kind == Kind::kSize;
    if (n.kind == Kind::kTensor) {
      e.has_tensor = true;
      return e;
    }
    if (!is_dict && !is_seq) {
      if (!scalar(n)) return e;
      st.pop_back();
      continue;
    }
    if (f.next == 0) {
      if (!on_path.insert(f.id).second) {
        e.unrepresentable = "container that contains itself";
        return e;
      }
      e.text.push_back(is_dict ? '{' : '[');
    }
    const std::size_t step = is_dict ? 2 : 1;
    if (f.next >= n.items.size()) {
      e.text.push_back(is_dict ? '}' : ']');
      on_path.erase(f.id);
      st.pop_back();
      continue;
    }
    if (f.next > 0) e.text.push_back(',');
    if (is_dict) {
      const Node& k = a[n.items[f.next]];
      if (k.kind == Kind::kStr)
        e.text += json_quote(k.text);
      else if (k.kind == Kind::kInt)
        e.text += json_quote(std::to_string(k.i));
      else {
        e.unrepresentable = "dict key of type " + std::string(kind_name(k.kind));
        return e;
      }
      e.text.push_back(':');
    }
    NodeId child = n.items[f.next + step - 1];
    f.next += step;
    st.push_back({child, 0});
  }
  return e;
}

// What encode() would give for every node reachable from `root`, computed
// once, bottom-up, iteratively (explicit stack): the exact compact JSON size
// capped at budget + 1, or kNotJson for a value encode() stops at (a tensor,
// a value JSON cannot hold, or a container that reaches a cycle). The walk
// in plan() asks this instead of encoding each container it descends
// through, which made a deep chain quadratic (every level re-encoded the
// levels below it up to the budget).
class JsonSizes {
 public:
  static constexpr std::uint64_t kNotJson = ~std::uint64_t{0};

  JsonSizes(const ValueArena& a, std::uint64_t budget) : a_(a), budget_(budget), size_(a.size(), kUnknown) {}

  std::uint64_t size(NodeId root) {
    if (root >= a_.size()) return kNotJson;
    if (size_[root] != kUnknown) return size_[root];
    struct Frame {
      NodeId id;
      std::size_t next;
      std::uint64_t acc;
      bool key_counted;  // the separator and key of item `next` are in acc
    };
    std::vector<Frame> st;
    auto open = [&](NodeId id) -> bool {  // true if pushed; else size_[id] is set
      const Node& n = a_[id];
      const bool is_dict = n.kind == Kind::kDict || n.kind == Kind::kOrderedDict;
      const bool is_seq = n.kind == Kind::kList || n.kind == Kind::kTuple || n.kind == Kind::kSize;
      if (!is_dict && !is_seq) {
        Encoded e = encode(a_, id, budget_);  // a leaf: one node
        size_[id] = !e.unrepresentable.empty() || e.has_tensor ? kNotJson : std::min(e.text.size(), budget_ + 1);
        return false;
      }
      size_[id] = kInProgress;
      st.push_back({id, 0, 2, false});
      return true;
    };
    if (!open(root)) return size_[root];
    while (!st.empty()) {
      Frame& f = st.back();
      const Node& n = a_[f.id];
      const bool is_dict = n.kind == Kind::kDict || n.kind == Kind::kOrderedDict;
      const std::size_t step = is_dict ? 2 : 1;
      auto finish = [&](std::uint64_t v) {
        size_[f.id] = v;
        st.pop_back();
      };
      if (f.acc == kNotJson) {
        finish(kNotJson);
        continue;
      }
      if (f.next + step > n.items.size()) {
        finish(std::min(f.acc, budget_ + 1));
        continue;
      }
      if (!f.key_counted && f.next > 0) f.acc += 1;  // ','
      if (!f.key_counted && is_dict) {
        const NodeId kid = n.items[f.next];
        if (kid >= a_.size()) {
          finish(kNotJson);
          continue;
        }
        const Node& k = a_[kid];
        if (k.kind == Kind::kStr)
          f.acc += json_quote(k.text).size() + 1;  // "key":
        else if (k.kind == Kind::kInt)
          f.acc += std::to_string(k.i).size() + 3;
        else {
          finish(kNotJson);
          continue;
        }
      }
      f.key_counted = true;
      const NodeId child = n.items[f.next + step - 1];
      if (child >= a_.size()) {
        finish(kNotJson);
        continue;
      }
      const std::uint64_t cs = size_[child];
      if (cs == kInProgress || cs == kNotJson) {  // a cycle, or a value JSON cannot hold
        finish(kNotJson);
        continue;
      }
      if (cs == kUnknown) {
        if (open(child)) continue;  // revisit this frame (same f.next) when the child is done
      }
      const std::uint64_t v = size_[child];
      if (v == kNotJson) {
        finish(kNotJson);
        continue;
      }
      f.acc = std::min(f.acc + v, budget_ + 1);
      f.next += step;
      f.key_counted = false;
    }
    return size_[root];
  }

 private:
  static constexpr std::uint64_t kUnknown = kNotJson - 1, kInProgress = kNotJson - 2;
  const ValueArena& a_;
  std::uint64_t budget_;
  std::vector<std::uint64_t> size_;
};

struct Plan {
  std::vector<SafetensorsEntry> entries;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<std::shared_ptr<std::vector<std::uint8_t>>> owned;
};

Result<Plan> plan(const Checkpoint& ckpt, const ToSafetensorsOptions& opt, std::vector<std::string>* notes) {
  auto note = [&](std::string s) {
    if (notes) notes->push_back(std::move(s));
  };
  const ValueArena& a = ckpt.values();
  Plan p;
  p.metadata = opt.metadata;
  std::uint64_t md_bytes = 0;
  std::unordered_map<std::uint32_t, std::string> tensor_name;       // tensor index -> first name
  std::map<std::uint32_t, std::vector<std::string>> storage_users;  // storage -> names
  std::unordered_set<NodeId> visited;
  bool dropped_metadata_attr = false;
  std::vector<std::string> dropped;

  auto add_tensor = [&](std::uint32_t ti, const std::string& name) -> Status {
    if (auto it = tensor_name.find(ti); it != tensor_name.end()) {
      note("\"" + name + "\" is the same tensor as \"" + it->second + "\"; written twice");
    }
    tensor_name.emplace(ti, name);
    const TensorInfo& t = ckpt.tensors()[ti];
    if (t.layout != Layout::kStrided)
      return unsupported("\"" + name + "\" is a sparse tensor; safetensors holds dense tensors only");
    if (t.is_meta) return unsupported("\"" + name + "\" is a meta tensor (no data)");
    if (t.dtensor)
      return unsupported("\"" + name +
                         "\" is a DTensor's local shard (one rank's piece): gather the rank files "
                         "first (gather_dtensor_ranks, `safeckpt convert --rank R0.pt --rank R1.pt ... OUT`)");
    if (dtype_is_quantized(t.dtype))
      return unsupported("\"" + name + "\" is a quantized tensor; safetensors has no quantized dtypes");
    if (t.conj || t.neg) return unsupported("\"" + name + "\" has a lazy conj/neg bit; resolve it before converting");
    std::string_view st = safetensors_dtype_name(t.dtype);
    if (st.empty())
      return unsupported("\"" + name + "\" has dtype " + std::string(dtype_name(t.dtype)) +
                         ", which safetensors lacks");
    if (t.storage >= ckpt.storages().size()) return make_error(ErrorCode::kInternal, "tensor without storage");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = std::string(st);
    std::uint64_t numel = 1;
    for (auto d : t.shape) {
      e.shape.push_back(static_cast<std::uint64_t>(d));
      numel *= static_cast<std::uint64_t>(d);
    }
    if (t.dtype == DType::kFloat4_e2m1fn_x2) {
      if (e.shape.empty()) return unsupported("\"" + name + "\": 0-d float4_e2m1fn_x2 has no safetensors shape");
      e.shape.back() *= 2;
    }
    const std::uint64_t es = dtype_size(t.dtype);
    const StorageInfo& s = ckpt.storages()[t.storage];
    if (numel == 0) {
      e.data = Bytes();
    } else if (is_c_contiguous(t.shape, t.stride)) {
      e.data = s.bytes.subspan(static_cast<std::size_t>(t.storage_offset) * es, numel * es);
    } else {
      SAFECKPT_TRY(std::vector<std::uint8_t> copy, ckpt.contiguous_bytes(ti));
      auto buf = std::make_shared<std::vector<std::uint8_t>>(std::move(copy));
      e.data = Bytes(buf->data(), buf->size());
      p.owned.push_back(std::move(buf));
      note("\"" + name + "\" is a non-contiguous view; written contiguous");
    }
    storage_users[t.storage].push_back(name);
    p.entries.push_back(std::move(e));
    return {};
  };

  JsonSizes sizes(a, opt.max_metadata_value_bytes);
  // Encodes only values that will be kept: a value that is dropped is never
  // encoded, and kept ones are bounded by max_metadata_bytes in total.
  auto add_value = [&](NodeId id, const std::string& name) -> Status {
    const std::uint64_t size = sizes.size(id);
    if (size == JsonSizes::kNotJson || size > opt.max_metadata_value_bytes ||
        md_bytes + size > opt.max_metadata_bytes) {
      if (opt.drop_non_tensors) {
        dropped.push_back(name);
        return {};
      }
      const Encoded enc = encode(a, id, opt.max_metadata_value_bytes);  // once: this ends the plan
      std::string why = !enc.unrepresentable.empty() ? "holds a " + enc.unrepresentable + ", which JSON cannot hold"
                                                     : "is too large for __metadata__";
      return unsupported("non-tensor value \"" + (name.empty() ? std::string("<root>") : name) + "\" (" +
                         std::string(kind_name(a[id].kind)) + ") " + why + "; use --drop-non-tensors to leave it out");
    }
    if (opt.drop_non_tensors) {
      dropped.push_back(name);
      return {};
    }
    for (const auto& [k, v] : p.metadata)
      if (k == name) return unsupported("metadata key \"" + name + "\" is used twice");
    const Encoded enc = encode(a, id, opt.max_metadata_value_bytes);
    md_bytes += enc.text.size();
    p.metadata.emplace_back(name.empty() ? "value" : name, enc.text);
    return {};
  };

  struct Frame {
    NodeId id;
    std::string name;
  };
  std::vector<Frame> st;
  if (ckpt.root() == kNoNode) return make_error(ErrorCode::kInternal, "checkpoint without root");
  st.push_back({ckpt.root(), ""});
  auto join = [](const std::string& pfx, const std::string& k) { return pfx.empty() ? k : pfx + "." + k; };
  while (!st.empty()) {
    Frame f = std::move(st.back());
    st.pop_back();
    const Node& n = a[f.id];
    if (n.kind == Kind::kTensor) {
      SAFECKPT_CHECK(add_tensor(static_cast<std::uint32_t>(n.i), f.name.empty() ? "tensor" : f.name));
      continue;
    }
    const bool is_dict = n.kind == Kind::kDict || n.kind == Kind::kOrderedDict;
    const bool is_seq = n.kind == Kind::kList || n.kind == Kind::kTuple;
    if (is_dict || is_seq) {
      // A container of plain data is one metadata value; one holding a
      // tensor (or something JSON cannot hold, or too much) is descended.
      const std::uint64_t size = sizes.size(f.id);
      if (!f.name.empty() && size != JsonSizes::kNotJson && size <= opt.max_metadata_value_bytes) {
        SAFECKPT_CHECK(add_value(f.id, f.name));
        continue;
      }
      if (!visited.insert(f.id).second) {
        note("container at \"" + f.name + "\" was met before; its tensors are written under the first path only");
        continue;
      }
      if (n.kind == Kind::kOrderedDict && n.attrs != kNoNode) dropped_metadata_attr = true;
      std::vector<Frame> kids;
      const std::size_t step = is_dict ? 2 : 1;
      for (std::size_t i = 0; i + step - 1 < n.items.size(); i += step) {
        std::string key;
        if (is_dict) {
          const Node& k = a[n.items[i]];
          if (k.kind == Kind::kStr)
            key = k.text;
          else if (k.kind == Kind::kInt)
            key = std::to_string(k.i);
          else
            return unsupported("dict key of type " + std::string(kind_name(k.kind)) + " under \"" + f.name +
                               "\" cannot name a safetensors entry");
        } else {
          key = std::to_string(i);
        }
        // Names grow with depth: a hostile chain a million levels deep (or a
        // memo-shared long key at every level) would make them quadratic.
        if (f.name.size() + 1 + key.size() > kMaxTensorNameBytes)
          return make_error(ErrorCode::kLimitExceeded,
                            "safetensors: an entry under \"" + f.name.substr(0, 64) + "...\" would be named by " +
                                std::to_string(f.name.size() + 1 + key.size()) + " bytes; the cap is " +
                                std::to_string(kMaxTensorNameBytes) + " (kMaxTensorNameBytes)");
        kids.push_back({n.items[i + step - 1], join(f.name, key)});
      }
      for (auto it = kids.rbegin(); it != kids.rend(); ++it) st.push_back(std::move(*it));
      continue;
    }
    SAFECKPT_CHECK(add_value(f.id, f.name));
  }
  // Nothing but the default metadata would be written: refuse rather than
  // write an empty file and report success (a whole module saved with
  // torch.save(model) keeps its tensors inside objects, which have no
  // safetensors name).
  if (p.entries.empty() && !dropped.empty()) {
    const Node& root = a[ckpt.root()];
    const std::string what = root.kind == Kind::kObject ? "its root is a " + root.text + " object"
                                                        : "its root is a " + std::string(kind_name(root.kind));
    return unsupported("nothing to write: no tensor has a safetensors name (" + what +
                       ") and --drop-non-tensors "
                       "drops every other value. A whole module saved with torch.save(model) keeps its tensors "
                       "inside objects: save model.state_dict() and convert that");
  }
  if (dropped_metadata_attr) note("state_dict _metadata (module versions) is not carried over");
  if (!dropped.empty()) {
    std::string s = "dropped " + std::to_string(dropped.size()) + " non-tensor value(s):";
    for (std::size_t i = 0; i < dropped.size() && i < 8; ++i) s += " " + (dropped[i].empty() ? "<root>" : dropped[i]);
    if (dropped.size() > 8) s += " ...";
    note(s);
  }
  for (const auto& [storage, users] : storage_users) {
    if (users.size() < 2) continue;
    std::string s = "tensors";
    for (std::size_t i = 0; i < users.size() && i < 6; ++i) s += (i ? ", \"" : " \"") + users[i] + "\"";
    if (users.size() > 6) s += ", ...";
    s += " share storage " + ckpt.storages()[storage].key + "; written as separate tensors";
    note(s);
  }
  return p;
}

}  // namespace

Status save_checkpoint_as_safetensors(const std::filesystem::path& path, const Checkpoint& ckpt,
                                      const ToSafetensorsOptions& convert, const SaveOptions& options,
                                      std::vector<std::string>* notes) {
  SAFECKPT_TRY(Plan p, plan(ckpt, convert, notes));
  return save_safetensors(path, std::move(p.entries), p.metadata, !p.metadata.empty(), options);
}

Result<std::vector<std::uint8_t>> checkpoint_to_safetensors(const Checkpoint& ckpt, const ToSafetensorsOptions& convert,
                                                            std::vector<std::string>* notes) {
  SAFECKPT_TRY(Plan p, plan(ckpt, convert, notes));
  return serialize_safetensors(std::move(p.entries), p.metadata, !p.metadata.empty());
}

}  // namespace safeckpt
