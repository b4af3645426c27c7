// Value tree -> corpus-schema JSON (include/safeckpt/json.hpp).
#include "safeckpt/json.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "checkpoint/paths.hpp"
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

bool is_dict_kind(Kind k) {
  return k == Kind::kDict || k == Kind::kOrderedDict || k == Kind::kCounter;
}

bool is_json_container(Kind k) {
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

const char* container_tag(Kind k) {
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

// A JSON string literal; invalid UTF-8 becomes U+FFFD (as before: nlohmann's
// error_handler_t::replace). Flat: no recursion.
std::string quote(const std::string& s) {
  return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

// Streams the value tree as JSON text with an explicit stack. Output bounds
// (json.hpp): emitted nodes <= max_output_nodes; bytes written while writing
// a node a second time (a shared sub-graph expanded again) <= 4 x the bytes
// of first writings + max_shared_output_bytes; indentation stops growing at
// kMaxIndentLevels, so a deep tree is never quadratic.
class Writer {
 public:
  Writer(const Checkpoint& c, const JsonOptions& o)
      : c_(c),
        o_(o),
        a_(c.values()),
        written_(a_.size(), false),
        on_path_(a_.size(), false),
        tensor_text_(c.tensors().size()) {}

  static constexpr std::size_t kMaxIndentLevels = 32;

  Result<std::string> run(NodeId root) {
    if (o_.schema_version) {
      // The root's own object gains a "$schema_version" member; a root that
      // is not a JSON object is wrapped as {"$schema_version": N, "$value": ...}.
      const bool object_root = root != kNoNode && root < a_.size() && is_json_container(a_[root].kind);
      out_ += "{\"$schema_version\": " + std::to_string(kInspectJsonSchemaVersion) + ", ";
      if (!object_root)
        out_ += "\"$value\": ";
      else
        root_merge_ = true;
    }
    if (root == kNoNode || root >= a_.size()) {
      out_ += "null";
    } else {
      SAFECKPT_CHECK(value(root, 0));
      while (!st_.empty()) SAFECKPT_CHECK(step());
    }
    if (o_.schema_version && !root_merged_) out_ += "}";
    out_.push_back('\n');
    return std::move(out_);
  }

 private:
  // phase: 0 = items, 1 = after items (odict metadata / object close)
  struct Frame {
    NodeId id;
    std::size_t depth;
    std::size_t next = 0;
    int phase = 0;
    bool reemit = false;
  };

  void newline(std::size_t depth) {
    if (o_.indent < 0) return;
    out_.push_back('\n');
    out_.append(std::min(depth, kMaxIndentLevels) * static_cast<std::size_t>(o_.indent), ' ');
  }
  const char* sep() const { return o_.indent < 0 ? "," : ", "; }
  const char* colon() const { return o_.indent < 0 ? ":" : ": "; }

  Status account(std::size_t before, bool reemit) {
    const std::uint64_t n = out_.size() - before;
    if (reemit || reemitting_ > 0) {
      shared_bytes_ += n;
      if (shared_bytes_ > 4 * first_bytes_ + o_.max_shared_output_bytes)
        return make_error(ErrorCode::kLimitExceeded,
                          "JSON output of shared (memoized) values exceeds 4 x the tree's own size + " +
                              std::to_string(o_.max_shared_output_bytes) +
                              " bytes (max_shared_output_bytes): a hostile graph expands exponentially");
    } else {
      first_bytes_ += n;
    }
    return {};
  }

  // Starts writing node `id` at `depth`: a leaf is written whole, a container is opened and pushed.
  Status value(NodeId id, std::size_t depth) {
    if (++emitted_ > o_.max_output_nodes)
      return make_error(ErrorCode::kLimitExceeded,
                        "JSON output exceeds max_output_nodes (" + std::to_string(o_.max_output_nodes) + " nodes)");
    const std::size_t before = out_.size();
    const bool reemit = written_[id];
    written_[id] = true;
    const Node& n = a_[id];
    if (!is_json_container(n.kind)) {
      SAFECKPT_CHECK(scalar(id));
      return account(before, reemit);
    }
    if (on_path_[id]) {  // a container met again inside itself: a cycle
      out_ += "{\"$ref\"" + std::string(colon()) + std::to_string(id) + "}";
      return account(before, reemit);
    }
    on_path_[id] = true;
    out_.push_back('{');
    if (root_merge_) {  // the schema member already opened this object
      out_.pop_back();
      root_merge_ = false;
      root_merged_ = true;
    }
    if (n.kind == Kind::kObject) {
      out_ += "\"$object\"" + std::string(colon()) + quote(n.text);
    } else {
      out_ += std::string("\"") + container_tag(n.kind) + "\"" + colon() + "[";
    }
    st_.push_back(Frame{id, depth, 0, 0, reemit});
    if (reemit) ++reemitting_;
    return account(before, false);
  }

  Status step() {
    Frame& f = st_.back();
    const Node& n = a_[f.id];
    const std::size_t before = out_.size();
    if (n.kind == Kind::kObject) {
      // {"$object": name, "args": A, "state": S}
      if (f.next < 2) {
        const std::size_t i = f.next++;
        out_ += std::string(sep()) + (i == 0 ? "\"args\"" : "\"state\"") + colon();
        const NodeId child = i < n.items.size() ? n.items[i] : kNoNode;
        const std::size_t depth = f.depth;
        SAFECKPT_CHECK(account(before, false));
        if (child == kNoNode || child >= a_.size()) {
          out_ += "null";
          return account(before, false);
        }
        return value(child, depth + 1);
      }
      return close(f, before, "}");
    }
    const bool dict = is_dict_kind(n.kind);
    if (f.phase == 0) {
      // Dict items are [key, value] pairs: positions 2k (opens "[") and 2k+1.
      if (f.next < (dict ? n.items.size() / 2 * 2 : n.items.size())) {
        const std::size_t i = f.next++;
        const std::size_t depth = f.depth;
        if (!dict || i % 2 == 0) {
          if (i != 0) out_.push_back(',');
          newline(depth + 1);
          if (dict) {
            out_.push_back('[');
            newline(depth + 2);
          }
        } else {
          out_.push_back(',');
          newline(depth + 2);
        }
        if (dict && i % 2 == 1) pair_close_.push_back(st_.size());
        SAFECKPT_CHECK(account(before, false));
        const NodeId child = n.items[i];
        if (child == kNoNode || child >= a_.size()) {
          out_ += "null";
          SAFECKPT_CHECK(account(before, false));
          return close_pair_if_done();
        }
        SAFECKPT_CHECK(value(child, depth + (dict ? 2 : 1)));
        return close_pair_if_done();
      }
      if (!n.items.empty()) newline(f.depth);
      out_.push_back(']');
      f.phase = 1;
      if (n.kind == Kind::kOrderedDict && n.attrs != kNoNode && n.attrs < a_.size()) {
        // `_metadata` attribute: the value under that key of the BUILD state.
        const Node& attrs = a_[n.attrs];
        for (std::size_t i = 0; i + 1 < attrs.items.size(); i += 2) {
          const NodeId k = attrs.items[i], v = attrs.items[i + 1];
          if (k != kNoNode && k < a_.size() && a_[k].kind == Kind::kStr && a_[k].text == "_metadata" && v != kNoNode &&
              v < a_.size()) {
            out_ += std::string(sep()) + "\"_metadata\"" + colon();
            const std::size_t depth = f.depth;
            SAFECKPT_CHECK(account(before, false));
            return value(v, depth + 1);
          }
        }
      }
      SAFECKPT_CHECK(account(before, false));
      return {};
    }
    return close(f, before, "}");
  }

  // After a dict value is written (a leaf at once, a container when its frame
  // closes) the pair's "]" follows.
  Status close_pair_if_done() {
    while (!pair_close_.empty() && pair_close_.back() == st_.size()) {
      pair_close_.pop_back();
      const std::size_t before = out_.size();
      newline(st_.back().depth + 1);
      out_.push_back(']');
      SAFECKPT_CHECK(account(before, false));
    }
    return {};
  }

  Status close(Frame& f, std::size_t before, const char* text) {
    out_ += text;
    on_path_[f.id] = false;
    const bool reemit = f.reemit;
    st_.pop_back();
    if (reemit) --reemitting_;
    SAFECKPT_CHECK(account(before, reemit));
    return close_pair_if_done();
  }

  std::size_t storage_id(std::uint32_t s) {
    auto it = storage_ids_.find(s);
    if (it != storage_ids_.end()) return it->second;
    std::size_t id = storage_ids_.size();
    storage_ids_.emplace(s, id);
    return id;
  }

  // One tensor's object; `sparse_indices` nests the (strided) indices tensor, one level at most.
  Result<json> tensor(std::uint32_t ti, bool nested) {
    const TensorInfo& t = c_.tensors()[ti];
    json d = json::object();
    d["dtype"] = std::string(dtype_name(t.dtype));
    d["shape"] = t.shape;
    d["requires_grad"] = t.requires_grad;
    d["parameter"] = t.is_parameter;
    if (!t.subclass.empty()) d["subclass"] = t.subclass;
    if (t.dtensor) {
      // The DTensor this tensor is the local shard of (safeckpt/tensor.hpp DTensorInfo).
      const DTensorInfo& x = *t.dtensor;
      json dt = json::object();
      dt["global_shape"] = x.global_shape;
      dt["mesh_shape"] = x.mesh_shape;
      if (!x.mesh_dim_names.empty()) dt["mesh_dim_names"] = x.mesh_dim_names;
      dt["mesh_device_type"] = x.mesh_device_type;
      dt["rank"] = x.rank;
      dt["coordinate"] = x.coordinate;
      json pl = json::array();
      for (const auto& p : x.placements)
        pl.push_back(p.kind == DTensorPlacement::Kind::kShard       ? "Shard(dim=" + std::to_string(p.dim) + ")"
                     : p.kind == DTensorPlacement::Kind::kReplicate ? std::string("Replicate()")
                                                                    : "Partial(" + p.reduce_op + ")");
      dt["placements"] = pl;
      dt["global_offset"] = x.global_offset;
      d["dtensor"] = dt;
    }
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
      if (t.layout == Layout::kSparseCoo && !nested && !t.sparse_parts.empty() &&
          t.sparse_parts[0] < c_.tensors().size()) {
        SAFECKPT_TRY(d["sparse_indices"], tensor(t.sparse_parts[0], true));
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

  std::string dump(const json& j) const { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

  Status scalar(NodeId id) {
    const Node& n = a_[id];
    switch (n.kind) {
      case Kind::kNone: out_ += "null"; return {};
      case Kind::kBool: out_ += n.flag ? "true" : "false"; return {};
      case Kind::kStr: out_ += quote(n.text); return {};
      case Kind::kTensor: {
        // Written once per tensor and reused: a tensor referenced a million
        // times is hashed once.
        const auto ti = static_cast<std::uint32_t>(n.i);
        if (ti >= tensor_text_.size()) return make_error(ErrorCode::kInternal, "JSON: tensor index out of range");
        if (tensor_text_[ti].empty()) {
          SAFECKPT_TRY(json j, tensor(ti, false));
          tensor_text_[ti] = dump(j);
        }
        out_ += tensor_text_[ti];
        return {};
      }
      default: break;
    }
    json j;
    switch (n.kind) {
      case Kind::kInt: j = json{{"$int", std::to_string(n.i)}}; break;
      case Kind::kBigInt: j = json{{"$int", n.text}}; break;
      case Kind::kFloat: j = json{{"$float", python_float_repr(n.re)}}; break;
      case Kind::kComplex: j = json{{"$complex", {python_float_repr(n.re), python_float_repr(n.im)}}}; break;
      case Kind::kBytes:
        j = json{{"$bytes", to_hex({reinterpret_cast<const std::uint8_t*>(n.text.data()), n.text.size()})}};
        break;
      case Kind::kByteArray:
        j = json{{"$bytearray", to_hex({reinterpret_cast<const std::uint8_t*>(n.text.data()), n.text.size()})}};
        break;
      case Kind::kSize: {
        json arr = json::array();
        for (NodeId e : n.items) arr.push_back(e < a_.size() ? a_[e].i : 0);
        j = json{{"$size", arr}};
        break;
      }
      case Kind::kDtype: j = json{{"$dtype", n.text}}; break;
      case Kind::kDevice: j = json{{"$device", n.text}}; break;
      case Kind::kLayout: j = json{{"$layout", n.text}}; break;
      case Kind::kQScheme: j = json{{"$qscheme", n.text}}; break;
      case Kind::kStorage: j = json{{"$storage", storage_id(static_cast<std::uint32_t>(n.i))}}; break;
      case Kind::kGlobal: j = json{{"$global", n.text}}; break;
      default: j = json{{"$ref", id}}; break;
    }
    out_ += dump(j);
    return {};
  }

  const Checkpoint& c_;
  const JsonOptions& o_;
  const ValueArena& a_;
  std::vector<bool> written_, on_path_;
  std::vector<std::string> tensor_text_;
  std::vector<Frame> st_;
  std::vector<std::size_t> pair_close_;  // stack sizes at which a dict pair's "]" is due
  std::unordered_map<std::uint32_t, std::size_t> storage_ids_;
  std::string out_;
  std::uint64_t emitted_ = 0, first_bytes_ = 0, shared_bytes_ = 0;
  std::size_t reemitting_ = 0;
  bool root_merge_ = false, root_merged_ = false;
};

}  // namespace

Result<std::string> to_json(const Checkpoint& ckpt, const JsonOptions& options) {
  try {
    Writer w(ckpt, options);
    return w.run(ckpt.root());
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kLimitExceeded, "out of memory writing JSON");
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kInternal, std::string("JSON: ") + e.what());
  }
}

// ---- text view ----------------------------------------------------------------------

namespace {

std::string shape_text(const std::vector<std::int64_t>& s, std::size_t max_bytes) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (out.size() > max_bytes) return out + ", …]";
    out += (i ? ", " : "") + std::to_string(s[i]);
  }
  return out + "]";
}

std::string human_bytes(std::uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

// Printable, one line, at most `max` bytes of input shown: control bytes,
// DEL and bytes >= 0x80 that are not valid UTF-8 become \xNN (a file's strings
// never reach a terminal raw).
std::string escaped(std::string_view s, std::size_t max, char quote) {
  std::string out;
  std::size_t i = 0;
  for (; i < s.size() && out.size() < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool utf8 = len > 1 && i + len <= s.size();
    for (std::size_t k = 1; utf8 && k < len; ++k) utf8 = (static_cast<unsigned char>(s[i + k]) >> 6) == 2;
    if (utf8) {
      out.append(s.substr(i, len));
      i += len - 1;
    } else if (c < 0x20 || c >= 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      if (c == static_cast<unsigned char>(quote) || c == '\\') out.push_back('\\');
      out.push_back(static_cast<char>(c));
    }
  }
  if (i < s.size()) out += "…";
  return out;
}

std::string cut(std::string s, std::size_t max) {
  if (s.size() <= max) return s;
  std::size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) >> 6) == 2) --n;  // not inside a UTF-8 sequence
  s.resize(n);
  return s + "…";
}

// One line for a value that is not expanded (a leaf, or a container not shown).
std::string repr(const ValueArena& a, const Checkpoint& c, NodeId id, std::size_t max) {
  const Node& n = a[id];
  switch (n.kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return n.flag ? "True" : "False";
    case Kind::kInt: return std::to_string(n.i);
    case Kind::kBigInt: return cut(n.text, max);
    case Kind::kFloat: return python_float_repr(n.re);
    case Kind::kComplex: {
      // As Python prints complex numbers: (1+2j), (1.5-2j).
      auto part = [](double v) {
        std::string r = python_float_repr(v);
        if (r.size() > 2 && r.compare(r.size() - 2, 2, ".0") == 0) r.resize(r.size() - 2);
        return r;
      };
      const std::string im = part(n.im);
      return "(" + part(n.re) + (im[0] == '-' ? "" : "+") + im + "j)";
    }
    case Kind::kStr: return "'" + escaped(n.text, max, '\'') + "'";
    case Kind::kBytes: return "b'" + escaped(n.text, max, '\'') + "'";
    case Kind::kByteArray: return "bytearray(b'" + escaped(n.text, max, '\'') + "')";
    case Kind::kSize: {
      std::vector<std::int64_t> dims;
      for (NodeId e : n.items) dims.push_back(e < a.size() ? a[e].i : 0);
      return "torch.Size(" + shape_text(dims, max) + ")";
    }
    case Kind::kDtype: return "torch." + escaped(n.text, max, 0);
    case Kind::kDevice: return "device('" + escaped(n.text, max, '\'') + "')";
    case Kind::kLayout:
    case Kind::kQScheme: return "torch." + escaped(n.text, max, 0);
    case Kind::kGlobal: return escaped(n.text, max, 0);
    case Kind::kObject: return "<" + escaped(n.text, max, 0) + " object>";
    case Kind::kStorage: return "<storage>";
    case Kind::kTensor: {
      const auto ti = static_cast<std::uint32_t>(n.i);
      if (ti >= c.tensors().size()) return "<tensor>";
      const TensorInfo& t = c.tensors()[ti];
      return "<tensor " + std::string(dtype_name(t.dtype)) + " " + shape_text(t.shape, max) + ">";
    }
    case Kind::kList: return "[… " + std::to_string(n.items.size()) + " items]";
    case Kind::kTuple: return "(… " + std::to_string(n.items.size()) + " items)";
    case Kind::kSet: return "{… set of " + std::to_string(n.items.size()) + "}";
    case Kind::kFrozenSet: return "frozenset({… " + std::to_string(n.items.size()) + " items})";
    case Kind::kSlice: return "slice(…)";
    case Kind::kDict:
    case Kind::kOrderedDict:
    case Kind::kCounter: return "{… " + std::to_string(n.items.size() / 2) + " items}";
  }
  return "?";
}

std::string pad(std::string s, std::size_t w, bool right = false) {
  // Width in code points (names are UTF-8): count bytes that start a character.
  std::size_t cps = 0;
  for (unsigned char ch : s) cps += (ch >> 6) != 2;
  if (cps >= w) return s;
  return right ? std::string(w - cps, ' ') + s : s + std::string(w - cps, ' ');
}

}  // namespace

Result<std::string> to_text(const Checkpoint& c, const TextOptions& o) {
  try {
    const ValueArena& a = c.values();
    // Tensor rows: every tensor reachable by a path (no depth cap: a deep
    // tensor is still listed, its name cut).
    struct Row {
      std::string name;
      std::uint32_t tensor;
    };
    // Every value is shown (user test finding): keys that are not str/int by
    // their repr in brackets ("[(1, 2)]"), and the insides of objects (a
    // whole module saved with torch.save(model): "__dict__._parameters.weight").
    detail::PathWalkOptions all;
    all.other_key = [&](NodeId k) {
      // A tuple key of plain values in full ("[(1, 2)]"), as Python prints it.
      const Node& kn = a[k];
      std::string text = repr(a, c, k, o.max_repr_bytes);
      if (kn.kind == Kind::kTuple && kn.items.size() <= 8) {
        std::string inl = "(";
        bool flat = true;
        for (std::size_t i = 0; i < kn.items.size() && flat; ++i) {
          const NodeId e = kn.items[i];
          flat = e < a.size() && !detail::is_named_container(a[e].kind) && a[e].kind != Kind::kTensor;
          if (flat) inl += (i ? ", " : "") + repr(a, c, e, o.max_repr_bytes);
        }
        inl += kn.items.size() == 1 ? ",)" : ")";
        if (flat && inl.size() <= o.max_repr_bytes) text = std::move(inl);
      }
      return "[" + text + "]";
    };
    all.into_objects = true;
    std::vector<Row> rows;
    std::vector<bool> seen(c.tensors().size(), false);
    detail::walk_paths(
        a, c.root(), o.max_name_bytes,
        [&](const detail::PathVisit& v) {
          const Node& n = a[v.id];
          if (n.kind != Kind::kTensor) return detail::WalkStep::kDescend;
          const auto t = static_cast<std::uint32_t>(n.i);
          if (t < seen.size() && !seen[t]) {
            seen[t] = true;
            std::string name = v.path.empty() && v.path_bytes == 0 ? "<root>" : escaped(v.path, o.max_name_bytes, 0);
            if (!v.path_complete) name += "…";
            rows.push_back({std::move(name), t});
          }
          return detail::WalkStep::kSkip;
        },
        all);

    std::string out;
    std::vector<int> storage_users(c.storages().size(), 0);
    for (const auto& t : c.tensors())
      if (t.storage != kNoStorage && t.storage < storage_users.size()) storage_users[t.storage]++;
    std::size_t w = 4;
    for (const auto& r : rows) w = std::max(w, r.name.size());
    w = std::min<std::size_t>(w, 60);
    out += escaped(o.title, 4096, 0) + ": " + std::string(file_format_name(c.format())) + " (" +
           std::to_string(rows.size()) + " tensors, " + std::to_string(c.storages().size()) + " storages)\n";
    out += pad("name", w) + "  " + pad("dtype", 14) + " " + pad("shape", 22) + " " + pad("bytes", 10, true) +
           "  storage\n";
    std::uint64_t tensor_bytes = 0;
    for (const auto& r : rows) {
      const TensorInfo& t = c.tensors()[r.tensor];
      const std::uint64_t bytes = t.numel() * dtype_size(t.dtype);
      tensor_bytes += bytes;
      std::string st = "-";
      if (t.storage != kNoStorage && t.storage < c.storages().size()) {
        st = escaped(c.storages()[t.storage].key, 64, 0);
        if (storage_users[t.storage] > 1) st += " (shared)";
      } else if (t.layout != Layout::kStrided) {
        st = std::string(layout_name(t.layout));
      }
      if (t.dtensor) {
        // The local shard of a DTensor: where it sits in the global tensor.
        std::string pl;
        for (const auto& p : t.dtensor->placements)
          pl += (pl.empty() ? "" : ", ") +
                (p.kind == DTensorPlacement::Kind::kShard       ? "Shard(" + std::to_string(p.dim) + ")"
                 : p.kind == DTensorPlacement::Kind::kReplicate ? std::string("Replicate")
                                                                : "Partial(" + p.reduce_op + ")");
        st += "  DTensor " + shape_text(t.dtensor->global_shape, 64) + " (" + pl + ") on mesh " +
              shape_text(t.dtensor->mesh_shape, 16) + " at " + shape_text(t.dtensor->global_offset, 64);
      }
      out += pad(r.name, w) + "  " + pad(std::string(dtype_name(t.dtype)) + (t.is_parameter ? "*" : ""), 14) + " " +
             pad(shape_text(t.shape, 64), 22) + " " + pad(std::to_string(bytes), 10, true) + "  " + st + "\n";
    }
    std::uint64_t storage_bytes = 0;
    for (const auto& s : c.storages()) storage_bytes += s.nbytes;
    out += "total: " + std::to_string(rows.size()) + " named tensors, " + human_bytes(tensor_bytes) +
           " of tensor data, " + human_bytes(storage_bytes) + " in " + std::to_string(c.storages().size()) +
           " storages (* = nn.Parameter)";
    if (rows.size() < c.tensors().size())
      out += "; " + std::to_string(c.tensors().size() - rows.size()) +
             " more tensor objects without a path (sparse parts, quantization parameters, DTensor internals)";
    out += "\n";

    // Non-tensor values by path, containers expanded once and at most max_depth deep.
    std::string values;
    std::uint64_t lines = 0, hidden = 0;
    auto line = [&](const detail::PathVisit& v, const std::string& text) {
      ++lines;
      if (lines > o.max_value_lines) {
        ++hidden;
        return;
      }
      std::string name = v.path_bytes == 0 ? "<root>" : escaped(v.path, o.max_name_bytes, 0);
      if (!v.path_complete) name += "…";
      values += "  " + name + " = " + text + "\n";
    };
    detail::walk_paths(
        a, c.root(), o.max_name_bytes,
        [&](const detail::PathVisit& v) {
          const Node& n = a[v.id];
          if (n.kind == Kind::kTensor) return detail::WalkStep::kSkip;  // a row above
          if (n.kind == Kind::kObject) {
            // The object's class on its own line, then what it holds.
            line(v, repr(a, c, v.id, o.max_repr_bytes) + (v.revisit ? " (the same object as an earlier path)" : ""));
            if (v.revisit) return detail::WalkStep::kSkip;
            if (v.depth >= o.max_depth) return detail::WalkStep::kSkip;
            return detail::WalkStep::kDescend;
          }
          if (!detail::is_named_container(n.kind)) {
            line(v, repr(a, c, v.id, o.max_repr_bytes));
            return detail::WalkStep::kSkip;
          }
          if (v.revisit) {
            line(v, repr(a, c, v.id, o.max_repr_bytes) + " (the same object as an earlier path)");
            return detail::WalkStep::kSkip;
          }
          if (n.items.empty()) {
            line(v, n.kind == Kind::kList ? "[]" : n.kind == Kind::kTuple ? "()" : "{}");
            return detail::WalkStep::kSkip;
          }
          if ((n.kind == Kind::kList || n.kind == Kind::kTuple) && n.items.size() <= 8) {
            // A short list/tuple of plain values on one line: "betas = (0.9, 0.999)".
            std::string inl = n.kind == Kind::kList ? "[" : "(";
            bool flat = true;
            for (std::size_t i = 0; i < n.items.size() && flat; ++i) {
              const NodeId e = n.items[i];
              flat = e < a.size() && !detail::is_named_container(a[e].kind) && a[e].kind != Kind::kTensor;
              if (flat) inl += (i ? ", " : "") + repr(a, c, e, o.max_repr_bytes);
            }
            if (n.kind == Kind::kTuple && n.items.size() == 1) inl += ",";
            inl += n.kind == Kind::kList ? "]" : ")";
            if (flat && inl.size() <= o.max_repr_bytes) {
              line(v, inl);
              return detail::WalkStep::kSkip;
            }
          }
          if (v.depth >= o.max_depth) {
            line(v, repr(a, c, v.id, o.max_repr_bytes) + " (nested deeper than " + std::to_string(o.max_depth) +
                        " levels: not shown)");
            return detail::WalkStep::kSkip;
          }
          return detail::WalkStep::kDescend;
        },
        all);
    if (lines > 0) {
      out += "values (" + std::to_string(lines) + " non-tensor, by path):\n" + values;
      if (hidden > 0)
        out += "  … " + std::to_string(hidden) + " more values not shown (--format json prints everything)\n";
    }
    return out;
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kLimitExceeded, "out of memory writing the text view");
  }
}

}  // namespace safeckpt
