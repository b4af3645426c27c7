// safetensors reader: the grammar at the top of include/safeckpt/safetensors_reader.hpp.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "safeckpt/builder.hpp"
#include "safeckpt/safetensors_reader.hpp"
#include "safetensors/internal.hpp"
#include "util/bytes.hpp"

namespace safeckpt {
namespace {

using json = nlohmann::json;

struct StDtype {
  std::string_view name;
  std::uint32_t bits;
  std::optional<DType> torch;
};

// huggingface/safetensors tensor.rs `enum Dtype`, in declaration order: the
// writer sorts by this order, descending ("increasing alignment order").
constexpr std::array<StDtype, 22> kDtypes{{
    {"BOOL", 8, DType::kBool},
    {"F4", 4, DType::kFloat4_e2m1fn_x2},
    {"F6_E2M3", 6, std::nullopt},
    {"F6_E3M2", 6, std::nullopt},
    {"U8", 8, DType::kUInt8},
    {"I8", 8, DType::kInt8},
    {"F8_E5M2", 8, DType::kFloat8_e5m2},
    {"F8_E4M3", 8, DType::kFloat8_e4m3fn},
    {"F8_E8M0", 8, DType::kFloat8_e8m0fnu},
    {"F8_E4M3FNUZ", 8, DType::kFloat8_e4m3fnuz},
    {"F8_E5M2FNUZ", 8, DType::kFloat8_e5m2fnuz},
    {"I16", 16, DType::kInt16},
    {"U16", 16, DType::kUInt16},
    {"F16", 16, DType::kFloat16},
    {"BF16", 16, DType::kBFloat16},
    {"I32", 32, DType::kInt32},
    {"U32", 32, DType::kUInt32},
    {"F32", 32, DType::kFloat32},
    {"C64", 64, DType::kComplex64},
    {"F64", 64, DType::kFloat64},
    {"I64", 64, DType::kInt64},
    {"U64", 64, DType::kUInt64},
}};

const StDtype* find_dtype(std::string_view name) {
  for (const auto& d : kDtypes)
    if (d.name == name) return &d;
  return nullptr;
}

Unexpected malformed(std::string msg) {
  return make_error(ErrorCode::kMalformed, "safetensors: " + std::move(msg));
}

}  // namespace

std::string_view safetensors_dtype_name(DType d) noexcept {
  for (const auto& x : kDtypes)
    if (x.torch && *x.torch == d) return x.name;
  return {};
}
std::optional<DType> dtype_from_safetensors(std::string_view name) noexcept {
  const StDtype* d = find_dtype(name);
  return d ? d->torch : std::nullopt;
}
std::uint32_t safetensors_dtype_bits(std::string_view name) noexcept {
  const StDtype* d = find_dtype(name);
  return d ? d->bits : 0;
}
int safetensors_dtype_rank(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kDtypes.size(); ++i)
    if (kDtypes[i].name == name) return static_cast<int>(i);
  return -1;
}

// The strict checks as a SAX pass that builds nothing: duplicate keys at
// every level, nesting deeper than `max_depth` (root object = 1), and the
// key order. Not nlohmann's callback parser: its end_object walks the whole
// parent object after each member object (to drop discarded values), which
// made a header of 50,000 tensor entries take seconds to minutes (review
// 2026-12-06).
namespace {
class StrictJsonPass final : public nlohmann::json_sax<json> {
 public:
  StrictJsonPass(std::size_t max_depth, JsonKeyOrder* order) : max_depth_(max_depth), order_(order) {}
  std::string why;  // set when a check fails

  bool null() override { return true; }
  bool boolean(bool /*v*/) override { return true; }
  bool number_integer(number_integer_t /*v*/) override { return true; }
  bool number_unsigned(number_unsigned_t /*v*/) override { return true; }
  bool number_float(number_float_t /*v*/, const string_t& /*s*/) override { return true; }
  bool string(string_t& /*v*/) override { return true; }
  bool binary(binary_t& /*v*/) override { return true; }
  bool start_object(std::size_t /*n*/) override {
    keys_.emplace_back();
    return enter();
  }
  bool key(string_t& k) override {
    if (keys_.empty() || !keys_.back().insert(k).second) return reject("duplicate key \"" + k + "\"");
    if (order_ != nullptr && level_ == 1) {
      order_->root.push_back(k);
      member_ = order_->root.size();
    } else if (order_ != nullptr && level_ == 2 && member_ != 0) {
      order_->members[order_->root[member_ - 1]].push_back(k);
    }
    return true;
  }
  bool end_object() override {
    if (!keys_.empty()) keys_.pop_back();
    --level_;
    return true;
  }
  bool start_array(std::size_t /*n*/) override { return enter(); }
  bool end_array() override {
    --level_;
    return true;
  }
  bool parse_error(std::size_t /*position*/, const std::string& /*token*/,
                   const nlohmann::detail::exception& ex) override {
    return reject(std::string("not valid JSON: ") + ex.what());
  }

 private:
  bool enter() {
    if (++level_ > max_depth_) return reject("nesting deeper than " + std::to_string(max_depth_));
    return true;
  }
  bool reject(std::string w) {
    if (why.empty()) why = std::move(w);
    return false;
  }
  std::size_t max_depth_;
  JsonKeyOrder* order_;
  std::size_t level_ = 0;
  std::size_t member_ = 0;  // 1 + index in order_->root of the root key being read
  std::vector<std::unordered_set<std::string>> keys_;
};
}  // namespace

// Parses JSON text refusing duplicate keys (at every level) and nesting
// deeper than `max_depth`: the checks first (StrictJsonPass), then the tree
// (plain parse, no callback). Throws nothing; kMalformed on any problem.
Result<json> parse_strict_json(std::string_view text, std::size_t max_depth, std::string_view what,
                               JsonKeyOrder* order) {
  try {
    StrictJsonPass pass(max_depth, order);
    if (!json::sax_parse(text.begin(), text.end(), &pass, nlohmann::json::input_format_t::json, /*strict=*/true,
                         /*ignore_comments=*/false))
      return malformed(std::string(what) + ": " + (pass.why.empty() ? std::string("not valid JSON") : pass.why));
    return json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    return malformed(std::string(what) + " is not valid JSON: " + e.what());
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kLimitExceeded, "safetensors: out of memory parsing " + std::string(what));
  }
}

Result<SafetensorsFile> SafetensorsFile::validate(SafetensorsFile f, const SafetensorsOptions& opt) {
  const Bytes b = f.bytes_;
  if (b.size() < 8)
    return malformed("file of " + std::to_string(b.size()) + " bytes is shorter than the 8-byte header length");
  std::uint64_t n = 0;
  n = util::load_le<std::uint64_t>(b.data());
  if (n > opt.max_header_bytes)
    return make_error(ErrorCode::kLimitExceeded, "safetensors: header of " + std::to_string(n) +
                                                     " bytes exceeds max_header_bytes " +
                                                     std::to_string(opt.max_header_bytes));
  if (n > b.size() - 8)
    return malformed("header length " + std::to_string(n) + " exceeds the " + std::to_string(b.size() - 8) +
                     " bytes after it");
  if (n < 2) return malformed("header of " + std::to_string(n) + " bytes cannot hold a JSON object");
  std::string_view text(reinterpret_cast<const char*>(b.data() + 8), static_cast<std::size_t>(n));
  if (text[0] != '{') return malformed("header does not start with '{'");
  if (!util::valid_utf8(text)) return malformed("header is not valid UTF-8");
  // The JSON tree is charged to limits.max_memory_bytes before it is built
  // (MemoryBudget::kJsonBytesPerByte bounds the tree per header byte), and
  // so is each tensor's metadata as it is listed.
  MemoryBudget budget(opt.limits.max_memory_bytes);
  {
    Status st = budget.charge(n * MemoryBudget::kJsonBytesPerByte, "safetensors header JSON");
    if (!st) return unexpected(std::move(st).error());
  }
  // Depth: root object (1) > tensor entry / __metadata__ (2) > shape,
  // data_offsets arrays (3).
  JsonKeyOrder order;
  SAFECKPT_TRY(json root, parse_strict_json(text, 3, "header", &order));
  if (!root.is_object()) return malformed("header is not a JSON object");
  const std::uint64_t data_start = 8 + n, data_size = b.size() - data_start;
  f.header_bytes_ = n;
  std::vector<SafetensorsTensor> ts;
  for (const std::string& key : order.root) {  // the header's order (ties of the data order below)
    const json& v = root.at(key);
    if (key == "__metadata__") {
      if (!v.is_object()) return malformed("__metadata__ is not an object");
      f.has_metadata_ = true;
      for (const std::string& mk : order.members[key]) {
        const json& mv = v.at(mk);
        if (!mv.is_string())
          return malformed("__metadata__[\"" + mk + "\"] is not a string (only string -> string is allowed)");
        f.metadata_.emplace_back(mk, mv.get<std::string>());
      }
      continue;
    }
    if (key.empty()) return malformed("empty tensor name");
    if (ts.size() >= opt.limits.max_tensors)
      return make_error(ErrorCode::kLimitExceeded,
                        "safetensors: more than max_tensors " + std::to_string(opt.limits.max_tensors) + " tensors");
    {
      Status st = budget.charge(MemoryBudget::kTensorBytes + 2 * key.size(), "safetensors tensor metadata");
      if (!st) return unexpected(std::move(st).error());
    }
    auto where = [&](const std::string& what) { return "tensor \"" + key + "\": " + what; };
    if (!v.is_object()) return malformed(where("entry is not an object"));
    for (auto m = v.begin(); m != v.end(); ++m)
      if (m.key() != "dtype" && m.key() != "shape" && m.key() != "data_offsets")
        return malformed(where("unknown field \"" + m.key() + "\""));
    if (!v.contains("dtype") || !v["dtype"].is_string()) return malformed(where("missing or non-string dtype"));
    if (!v.contains("shape") || !v["shape"].is_array()) return malformed(where("missing or non-array shape"));
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      return malformed(where("data_offsets must be [begin, end]"));
    SafetensorsTensor t;
    t.name = key;
    t.dtype = v["dtype"].get<std::string>();
    const StDtype* d = find_dtype(t.dtype);
    if (!d) return malformed(where("unknown dtype \"" + t.dtype + "\""));
    const json& shape = v["shape"];
    if (shape.size() > opt.limits.max_tensor_rank)
      return make_error(ErrorCode::kLimitExceeded,
                        "safetensors: " + where("rank " + std::to_string(shape.size()) + " exceeds max_tensor_rank"));
    std::uint64_t numel = 1;
    bool overflow = false;
    for (const json& dim : shape) {
      if (!dim.is_number_unsigned()) return malformed(where("shape entries must be non-negative integers"));
      auto x = dim.get<std::uint64_t>();
      t.shape.push_back(x);
      if (x != 0 && numel > std::numeric_limits<std::uint64_t>::max() / x)
        overflow = true;
      else
        numel *= x;
    }
    for (auto x : t.shape)
      if (x == 0) numel = 0, overflow = false;
    if (overflow) return malformed(where("element count overflows"));
    if (numel > std::numeric_limits<std::uint64_t>::max() / d->bits) return malformed(where("byte size overflows"));
    const std::uint64_t bits = numel * d->bits;
    if (bits % 8 != 0)
      return malformed(where(std::to_string(numel) + " elements of " + t.dtype + " do not fill whole bytes"));
    const json& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return malformed(where("data_offsets must be non-negative integers"));
    t.begin = off[0].get<std::uint64_t>();
    t.end = off[1].get<std::uint64_t>();
    if (t.end < t.begin) return malformed(where("data_offsets end < begin"));
    if (t.end - t.begin != bits / 8)
      return malformed(where("data_offsets span " + std::to_string(t.end - t.begin) +
                             " bytes but dtype and shape need " + std::to_string(bits / 8)));
    if (t.end > data_size)
      return malformed(where("data_offsets end " + std::to_string(t.end) + " is past the data section of " +
                             std::to_string(data_size) + " bytes"));
    t.file_offset = data_start + t.begin;
    t.data = b.subspan(static_cast<std::size_t>(t.file_offset), static_cast<std::size_t>(t.end - t.begin));
    ts.push_back(std::move(t));
  }
  // Rule 6: tile the data section exactly.
  std::stable_sort(ts.begin(), ts.end(), [](const SafetensorsTensor& x, const SafetensorsTensor& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  std::uint64_t cursor = 0;
  for (const auto& t : ts) {
    if (t.begin != cursor)
      return malformed("tensor \"" + t.name + "\" starts at " + std::to_string(t.begin) +
                       " but the previous data ends at " + std::to_string(cursor) +
                       (t.begin < cursor ? " (overlap)" : " (gap)"));
    cursor = t.end;
  }
  if (cursor != data_size)
    return malformed("tensor data ends at " + std::to_string(cursor) + " but the data section has " +
                     std::to_string(data_size) + " bytes");
  f.tensors_ = std::move(ts);
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path, const SafetensorsOptions& options) {
  SAFECKPT_TRY(MappedFile mf, MappedFile::open(path));
  return from_file(std::move(mf), options);
}

Result<SafetensorsFile> SafetensorsFile::from_file(MappedFile file, const SafetensorsOptions& options) {
  const std::string name = file.path().string();
  SafetensorsFile f;
  f.file_ = std::move(file);
  f.bytes_ = f.file_.bytes();
  auto r = validate(std::move(f), options);
  if (!r && !name.empty()) r.error().at_record(name);
  return r;
}

Result<SafetensorsFile> SafetensorsFile::parse(Bytes data, const SafetensorsOptions& options) {
  SafetensorsFile f;
  f.bytes_ = data;
  return validate(std::move(f), options);
}

Result<SafetensorsFile> SafetensorsFile::parse_buffer(std::vector<std::uint8_t> data,
                                                      const SafetensorsOptions& options) {
  SafetensorsFile f;
  f.file_ = MappedFile::from_buffer(std::move(data));
  f.bytes_ = f.file_.bytes();
  return validate(std::move(f), options);
}

// ---- as a Checkpoint ----

Status add_safetensors_tensor(CheckpointBuilder& b, const SafetensorsTensor& t, NodeId& out) {
  auto d = dtype_from_safetensors(t.dtype);
  if (!d)
    return make_error(ErrorCode::kUnsupported, "safetensors: tensor \"" + t.name + "\" has dtype " + t.dtype +
                                                   ", which PyTorch has no dtype for");
  std::vector<std::int64_t> shape;
  for (auto x : t.shape) {
    if (x > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return malformed("tensor \"" + t.name + "\": dimension too large");
    shape.push_back(static_cast<std::int64_t>(x));
  }
  if (*d == DType::kFloat4_e2m1fn_x2) {
    // safetensors counts 4-bit values; torch.float4_e2m1fn_x2 packs two.
    if (shape.empty() || shape.back() % 2 != 0)
      return make_error(ErrorCode::kUnsupported, "safetensors: F4 tensor \"" + t.name +
                                                     "\" has an odd last dimension; float4_e2m1fn_x2 packs pairs");
    shape.back() /= 2;
  }
  SAFECKPT_TRY(std::uint32_t s, b.add_storage_borrowed(*d, t.data, "cpu", t.file_offset));
  b.storage(s).record = t.name;
  SAFECKPT_TRY(out, b.add_tensor(*d, std::move(shape), s));
  return {};
}

namespace {
Result<Checkpoint> as_checkpoint(CheckpointBuilder b, const std::vector<SafetensorsTensor>& ts) {
  for (const auto& t : ts) {
    NodeId node;
    SAFECKPT_CHECK(add_safetensors_tensor(b, t, node));
    SAFECKPT_CHECK(b.add_state_dict_value(t.name, node));
  }
  if (b.root() == kNoNode) b.set_root(b.container(Kind::kOrderedDict, {}));
  b.set_format(FileFormat::kSafetensors);
  return std::move(b).finish();
}
}  // namespace

Result<Checkpoint> load_safetensors(const std::filesystem::path& path, const SafetensorsOptions& options) {
  SAFECKPT_TRY(MappedFile mf, MappedFile::open(path));
  return load_safetensors_file(std::move(mf), options);
}

Result<Checkpoint> load_safetensors_file(MappedFile file, const SafetensorsOptions& options) {
  SAFECKPT_TRY(SafetensorsFile f, SafetensorsFile::from_file(std::move(file), options));
  std::vector<SafetensorsTensor> ts = f.tensors();
  CheckpointBuilder b(std::move(f).take_file());  // the views stay valid: the mapping does not move
  b.set_limits(options.limits);
  return as_checkpoint(std::move(b), ts);
}

Result<Checkpoint> load_safetensors_bytes(Bytes data, const SafetensorsOptions& options) {
  SAFECKPT_TRY(SafetensorsFile f, SafetensorsFile::parse(data, options));
  CheckpointBuilder b;
  b.set_limits(options.limits);
  return as_checkpoint(std::move(b), f.tensors());
}

// ---- sharded ----

Result<SafetensorsIndex> parse_safetensors_index(std::string_view text, const SafetensorsOptions& options) {
  if (text.size() > options.max_header_bytes)
    return make_error(ErrorCode::kLimitExceeded, "safetensors index: larger than max_header_bytes");
  if (!util::valid_utf8(text)) return malformed("index is not valid UTF-8");
  JsonKeyOrder order;
  SAFECKPT_TRY(json root, parse_strict_json(text, 64, "index", &order));
  if (!root.is_object()) return malformed("index is not a JSON object");
  if (!root.contains("weight_map") || !root["weight_map"].is_object())
    return malformed("index has no weight_map object");
  SafetensorsIndex idx;
  if (root.contains("metadata")) idx.metadata_json = root["metadata"].dump();
  std::unordered_set<std::string> seen;
  const json& wm = root["weight_map"];
  if (wm.size() > options.limits.max_tensors)
    return make_error(ErrorCode::kLimitExceeded, "safetensors index: more than max_tensors entries");
  for (const std::string& name : order.members["weight_map"]) {  // file order
    const json& value = wm.at(name);
    if (!value.is_string()) return malformed("index weight_map[\"" + name + "\"] is not a string");
    std::string shard = value.get<std::string>();
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos)
      return malformed("index names shard \"" + shard + "\", which is not a plain file name");
    if (seen.insert(shard).second) {
      if (idx.shards.size() >= options.max_shards)
        return make_error(ErrorCode::kLimitExceeded, "safetensors index: more than max_shards " +
                                                         std::to_string(options.max_shards) + " shard files");
      idx.shards.push_back(shard);
    }
    idx.weight_map.emplace_back(name, std::move(shard));
  }
  return idx;
}

namespace {

// The Hugging Face cache keeps a revision as <repo>/snapshots/<rev>/<file>,
// each file a symlink to <repo>/blobs/<sha> (huggingface_hub file_download.py,
// `_create_symlink`). When the index's real directory has that shape, its
// shards may resolve into <repo>/blobs/; returns that directory, else "".
std::filesystem::path hf_cache_blobs(const std::filesystem::path& dir_real) {
  if (dir_real.empty() || dir_real.parent_path().filename() != "snapshots") return {};
  std::filesystem::path blobs = dir_real.parent_path().parent_path() / "blobs";
  std::error_code ec;
  return std::filesystem::is_directory(blobs, ec) ? blobs : std::filesystem::path();
}

// Opens shard `name` (a plain file name, parse_safetensors_index) in the
// directory `dirfd` exactly once. A regular file is opened with O_NOFOLLOW
// (it cannot be swapped for a symlink in between); a symlink is followed and
// the file it opened must lie in `dir_real`, or in `blobs` (the Hugging Face
// cache layout, hf_cache_blobs) — checked on the descriptor, so no race with
// the link changing.
Result<MappedFile> open_shard(int dirfd, const std::filesystem::path& dir_real, const std::filesystem::path& blobs,
                              const std::filesystem::path& shown, const std::string& name) {
  struct stat lst {};
  if (::fstatat(dirfd, name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) != 0)
    return make_error(ErrorCode::kIo, "cannot open shard " + shown.string() + ": " + std::strerror(errno));
  const bool link = S_ISLNK(lst.st_mode);
  // O_NONBLOCK: a FIFO (or a link to one) must not block the open;
  // MappedFile::adopt then refuses anything but a regular file (review
  // 2026-12-06: `inspect model.safetensors.index.json` hung on a FIFO shard).
  int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (link ? 0 : O_NOFOLLOW));
  if (fd < 0) return make_error(ErrorCode::kIo, "cannot open shard " + shown.string() + ": " + std::strerror(errno));
  if (link) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
    const bool inside = !ec && (target.parent_path() == dir_real || (!blobs.empty() && target.parent_path() == blobs));
    if (!inside) {
      ::close(fd);
      return malformed("shard " + shown.string() + " is a symlink to " +
                       (ec ? std::string("a file that cannot be located") : target.string()) +
                       ", outside the index's directory " + dir_real.string() +
                       (blobs.empty() ? std::string() : " and the cache's " + blobs.string()));
    }
  }
  return MappedFile::adopt(fd, shown);
}

}  // namespace

Result<Checkpoint> load_safetensors_index(const std::filesystem::path& index_path, const SafetensorsOptions& options) {
  SAFECKPT_TRY(MappedFile mf, MappedFile::open(index_path));
  return load_safetensors_index_file(std::move(mf), options);
}

Result<std::vector<IndexShard>> open_index_shards(const std::filesystem::path& index_path,
                                                  const SafetensorsIndex& idx) {
  const std::filesystem::path dir = index_path.has_parent_path() ? index_path.parent_path() : ".";
  int dirfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0)
    return make_error(ErrorCode::kIo,
                      "cannot open the index's directory " + dir.string() + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{dirfd};
  std::error_code ec;
  auto dir_real = std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(dirfd), ec);
  if (ec) dir_real.clear();  // no /proc: symlinked shards are refused below
  const std::filesystem::path blobs = hf_cache_blobs(dir_real);
  std::vector<IndexShard> out;
  out.reserve(idx.shards.size());
  for (const auto& name : idx.shards) {
    auto mf = open_shard(dirfd, dir_real, blobs, dir / name, name);
    if (!mf) return unexpected(std::move(mf.error().at_record(index_path.string())));
    out.push_back(IndexShard{name, std::move(*mf)});
  }
  return out;
}

Result<Checkpoint> load_safetensors_index_file(MappedFile index, const SafetensorsOptions& options) {
  const std::filesystem::path index_path = index.path();
  std::string_view text(reinterpret_cast<const char*>(index.bytes().data()), index.size());
  auto parsed = parse_safetensors_index(text, options);
  if (!parsed) return unexpected(std::move(parsed.error().at_record(index_path.string())));
  const SafetensorsIndex idx = std::move(*parsed);
  SAFECKPT_TRY(std::vector<IndexShard> opened, open_index_shards(index_path, idx));
  return load_safetensors_index_shards(std::move(index), idx, std::move(opened), options);
}

Result<Checkpoint> load_safetensors_index_shards(MappedFile index, const SafetensorsIndex& idx,
                                                 std::vector<IndexShard> opened, const SafetensorsOptions& options) {
  CheckpointBuilder b(std::move(index));
  b.set_limits(options.limits);
  std::unordered_map<std::string, std::shared_ptr<SafetensorsFile>> shards;
  for (auto& [name, mf] : opened) {
    auto f = SafetensorsFile::from_file(std::move(mf), options);
    if (!f) return unexpected(std::move(f.error()));
    auto sp = std::make_shared<SafetensorsFile>(std::move(*f));
    b.keep_alive(sp);  // the Checkpoint keeps every shard mapped
    shards.emplace(name, std::move(sp));
  }
  std::unordered_map<std::string, std::string> owner;
  for (const auto& [tensor, shard] : idx.weight_map) owner.emplace(tensor, shard);
  for (const auto& [name, f] : shards)
    for (const auto& t : f->tensors()) {
      auto it = owner.find(t.name);
      if (it == owner.end() || it->second != name)
        return malformed("shard " + name + " holds tensor \"" + t.name + "\", which the index " +
                         (it == owner.end() ? "does not list" : "assigns to " + it->second));
    }
  for (const auto& [tensor, shard] : idx.weight_map) {
    const auto sh = shards.find(shard);
    if (sh == shards.end())
      return make_error(ErrorCode::kInvalidArgument, "shard " + shard + " of the index was not opened");
    const SafetensorsTensor* t = sh->second->find(tensor);
    if (!t) return malformed("index maps \"" + tensor + "\" to " + shard + ", which does not hold it");
    NodeId node;
    SAFECKPT_CHECK(add_safetensors_tensor(b, *t, node));
    b.storage(static_cast<std::uint32_t>(b.storages().size() - 1)).file_offset = Location::kNoOffset;  // not in file()
    b.storage(static_cast<std::uint32_t>(b.storages().size() - 1)).record = shard + ":" + tensor;
    SAFECKPT_CHECK(b.add_state_dict_value(tensor, node));
  }
  if (b.root() == kNoNode) b.set_root(b.container(Kind::kOrderedDict, {}));
  b.set_format(FileFormat::kSafetensors);
  return std::move(b).finish();
}

}  // namespace safeckpt
