// Value tree -> corpus-schema JSON (include/safeckpt/json.hpp).
#include "safeckpt/json.hpp"

#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "safeckpt/hash.hpp"

namespace safeckpt {

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's float_repr_style rules:
  // scientific when exp < -4 or exp >= 16, else positional with ".0".
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  auto e = s.find('e');
  std::string mant = s.substr(0, e);
  int exp = std::stoi(s.substr(e + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
  } else {
    std::size_t ip = static_cast<std::size_t>(exp) + 1;
    if (digits.size() <= ip) {
      out = digits + std::string(ip - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, ip) + "." + digits.substr(ip);
    }
  }
  return neg ? "-" + out : out;
}

namespace {

using nlohmann::json;

class Emitter {
 public:
  Emitter(const Checkpoint& c, const JsonOptions& o) : c_(c), o_(o), a_(c.values()) {}

  Result<json> run(NodeId root) {
    // Explicit stack: each frame fills `out` (a json being built) from a node.
    struct Frame {
      NodeId id;
      json* out;
      std::size_t next = 0;
      int phase = 0;  // 0 = start, 1 = items, 2 = metadata done
    };
    json result;
    std::vector<Frame> st{{root, &result}};
    // Pointers into json arrays stay valid: arrays are pre-sized before children are filled.
    while (!st.empty()) {
      Frame& f = st.back();
      if (++emitted_ > o_.max_output_nodes)
        return make_error(ErrorCode::kLimitExceeded, "JSON output exceeds max_output_nodes");
      const Node& n = a_[f.id];
      if (f.phase == 0) {
        if (!is_container(n.kind)) {
          SAFECKPT_TRY(*f.out, scalar(f.id));
          st.pop_back();
          continue;
        }
        if (on_path_.count(f.id)) {  // cycle: bounded output
          *f.out = json{{"$ref", f.id}};
          st.pop_back();
          continue;
        }
        on_path_.insert(f.id);
        f.phase = 1;
        *f.out = open_container(n);
      }
      json& items = items_of(*f.out, n);
      bool dict = n.kind == Kind::kDict || n.kind == Kind::kOrderedDict || n.kind == Kind::kCounter;
      if (f.phase == 1 && f.next < n.items.size()) {
        std::size_t i = f.next++;
        if (n.items[i] == kNoNode) {
          items_at(items, n, i) = nullptr;
          continue;
        }
        json& slot = items_at(items, n, i);
        (void)dict;
        st.push_back(Frame{n.items[i], &slot});
        continue;
      }
      if (f.phase == 1 && n.kind == Kind::kOrderedDict && n.attrs != kNoNode) {
        f.phase = 2;
        // `_metadata` attribute: the value under that key of the BUILD state.
        const Node& attrs = a_[n.attrs];
        for (std::size_t i = 0; i + 1 < attrs.items.size(); i += 2) {
          if (a_[attrs.items[i]].kind == Kind::kStr && a_[attrs.items[i]].text == "_metadata") {
            (*f.out)["_metadata"] = nullptr;
            st.push_back(Frame{attrs.items[i + 1], &(*f.out)["_metadata"]});
            break;
          }
        }
        continue;
      }
      on_path_.erase(f.id);
      st.pop_back();
    }
    return result;
  }

 private:
  static bool is_container(Kind k) {
    switch (k) {
      case Kind::kList:
      case Kind::kTuple:
      case Kind::kSet:
      case Kind::kFrozenSet:
      case Kind::kSlice:
      case Kind::kDict:
      case Kind::kOrderedDict:
      case Kind::kCounter:
      case Kind::kObject: return true;
      default: return false;
    }
  }
  static std::string tag(Kind k) {
    switch (k) {
      case Kind::kList: return "$list";
      case Kind::kTuple: return "$tuple";
      case Kind::kSet: return "$set";
      case Kind::kFrozenSet: return "$frozenset";
      case Kind::kSlice: return "$slice";
      case Kind::kOrderedDict: return "$odict";
      default: return "$dict";
    }
  }
  json open_container(const Node& n) {
    if (n.kind == Kind::kObject) {
      json o = json::object();
      o["$object"] = n.text;
      o["args"] = nullptr;
      o["state"] = nullptr;
      return o;
    }
    bool dict = n.kind == Kind::kDict || n.kind == Kind::kOrderedDict || n.kind == Kind::kCounter;
    json arr = json::array();
    if (dict) {
      for (std::size_t i = 0; i < n.items.size() / 2; ++i) arr.push_back(json::array({nullptr, nullptr}));
    } else {
      for (std::size_t i = 0; i < n.items.size(); ++i) arr.push_back(nullptr);
    }
    json o = json::object();
    o[tag(n.kind)] = std::move(arr);
    return o;
  }
  json& items_of(json& out, const Node& n) {
    if (n.kind == Kind::kObject) return out;
    return out[tag(n.kind)];
  }
  json& items_at(json& items, const Node& n, std::size_t i) {
    if (n.kind == Kind::kObject) return items[i == 0 ? "args" : "state"];
    bool dict = n.kind == Kind::kDict || n.kind == Kind::kOrderedDict || n.kind == Kind::kCounter;
    return dict ? items[i / 2][i % 2] : items[i];
  }

  std::size_t storage_id(std::uint32_t s) {
    auto it = storage_ids_.find(s);
    if (it != storage_ids_.end()) return it->second;
    std::size_t id = storage_ids_.size();
    storage_ids_.emplace(s, id);
    return id;
  }

  Result<json> tensor(std::uint32_t ti) {
    const TensorInfo& t = c_.tensors()[ti];
    json d = json::object();
    d["dtype"] = std::string(dtype_name(t.dtype));
    d["shape"] = t.shape;
    d["requires_grad"] = t.requires_grad;
    d["parameter"] = t.is_parameter;
    if (!t.subclass.empty()) d["subclass"] = t.subclass;
    d["layout"] = std::string(layout_name(t.layout));
    if (t.layout == Layout::kStrided) {
      d["stride"] = t.stride;
      d["storage_offset"] = t.storage_offset;
      if (t.storage != kNoStorage) {
        const StorageInfo& s = c_.storages()[t.storage];
        d["storage_nbytes"] = s.nbytes;
        d["storage_id"] = storage_id(t.storage);
        if (o_.hashes) d["storage_sha256"] = sha256_hex(s.bytes);
      }
      if (o_.hashes && !t.is_meta) {
        SAFECKPT_TRY(auto bytes, c_.contiguous_bytes(ti));
        d["sha256"] = sha256_hex(bytes);
      }
      if (t.qscheme != QScheme::kNone) {
        d["qscheme"] = std::string(qscheme_name(t.qscheme));
        if (t.qscheme == QScheme::kPerTensorAffine) {
          d["q_scale"] = t.q_scale;
          d["q_zero_point"] = t.q_zero_point;
        }
      }
    } else {
      if (t.layout == Layout::kSparseCoo) {
        SAFECKPT_TRY(d["sparse_indices"], tensor(t.sparse_parts[0]));
      } else {
        d["sparse_indices"] = nullptr;
      }
      if (o_.hashes) {
        SAFECKPT_TRY(auto bytes, c_.dense_bytes(ti));
        d["dense_sha256"] = sha256_hex(bytes);
      }
    }
    if (!t.device.empty()) d["device"] = t.device;
    return json{{"$tensor", std::move(d)}};
  }

  Result<json> scalar(NodeId id) {
    const Node& n = a_[id];
    switch (n.kind) {
      case Kind::kNone: return json(nullptr);
      case Kind::kBool: return json(n.flag);
      case Kind::kInt: return json{{"$int", std::to_string(n.i)}};
      case Kind::kBigInt: return json{{"$int", n.text}};
      case Kind::kFloat: return json{{"$float", python_float_repr(n.re)}};
      case Kind::kComplex: return json{{"$complex", {python_float_repr(n.re), python_float_repr(n.im)}}};
      case Kind::kStr: return json(n.text);
      case Kind::kBytes:
        return json{{"$bytes", to_hex({reinterpret_cast<const std::uint8_t*>(n.text.data()), n.text.size()})}};
      case Kind::kByteArray:
        return json{{"$bytearray", to_hex({reinterpret_cast<const std::uint8_t*>(n.text.data()), n.text.size()})}};
      case Kind::kSize: {
        json arr = json::array();
        for (NodeId e : n.items) arr.push_back(a_[e].i);
        return json{{"$size", arr}};
      }
      case Kind::kDtype: return json{{"$dtype", n.text}};
      case Kind::kDevice: return json{{"$device", n.text}};
      case Kind::kLayout: return json{{"$layout", n.text}};
      case Kind::kQScheme: return json{{"$qscheme", n.text}};
      case Kind::kTensor: return tensor(static_cast<std::uint32_t>(n.i));
      case Kind::kStorage: return json{{"$storage", storage_id(static_cast<std::uint32_t>(n.i))}};
      case Kind::kGlobal: return json{{"$global", n.text}};
      default: return json{{"$ref", id}};
    }
  }

  const Checkpoint& c_;
  const JsonOptions& o_;
  const ValueArena& a_;
  std::unordered_set<NodeId> on_path_;
  std::unordered_map<std::uint32_t, std::size_t> storage_ids_;
  std::uint64_t emitted_ = 0;
};

}  // namespace

Result<std::string> to_json(const Checkpoint& ckpt, const JsonOptions& options) {
  try {
    Emitter e(ckpt, options);
    SAFECKPT_TRY(json j, e.run(ckpt.root()));
    std::string s = j.dump(options.indent, ' ', false, json::error_handler_t::replace);
    s.push_back('\n');
    return s;
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kLimitExceeded, "out of memory writing JSON");
  }
}

}  // namespace safeckpt
