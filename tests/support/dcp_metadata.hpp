// A hand-written DCP `.metadata` pickle (protocol 2, no memo, no frames) in
// the shapes of PyTorch 2.11's: NEWOBJ + BUILD dataclasses, TensorProperties'
// 5-tuple state, float32 tensors. For the refusal cases of the DCP reader and
// the scanner: each case differs from a well-formed directory in one thing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dcp_test {

constexpr const char* kMd = "torch.distributed.checkpoint.metadata";

// offset -1: right after the previous chunk written to the same file (the
// writer's layout; two chunks never share bytes unless a case says so).
struct Chunk {
  std::vector<std::int64_t> offsets, sizes;
  std::string file = "__0_0.distcp";
  std::int64_t offset = -1, length = 64;
};
struct Tensor {
  std::string fqn;
  std::vector<std::int64_t> shape;
  std::vector<Chunk> chunks;
};

// Protocol-2 pickle text of a Metadata (no memo, no frames).
class Writer {
 public:
  std::string s = "\x80\x02";
  void global(const std::string& mod, const std::string& name) { s += "c" + mod + "\n" + name + "\n"; }
  void str(const std::string& v) {
    s += 'X';
    const auto n = static_cast<std::uint32_t>(v.size());
    for (int i = 0; i < 4; ++i) s += static_cast<char>((n >> (8 * i)) & 0xff);
    s += v;
  }
  void integer(std::int64_t v) {
    s += 'J';
    const auto u = static_cast<std::uint32_t>(static_cast<std::int32_t>(v));
    for (int i = 0; i < 4; ++i) s += static_cast<char>((u >> (8 * i)) & 0xff);
  }
  void size(const std::vector<std::int64_t>& v) {
    global("torch", "Size");
    s += '(';
    for (auto x : v) integer(x);
    s += "t\x85R";  // TUPLE, TUPLE1, REDUCE
  }
  // NEWOBJ of metadata class `cls`, then BUILD with a dict made by `fields`.
  template <class F>
  void dataclass(const std::string& mod, const std::string& cls, F fields) {
    global(mod, cls);
    s += ")\x81}(";  // EMPTY_TUPLE NEWOBJ EMPTY_DICT MARK
    fields();
    s += "ub";  // SETITEMS BUILD
  }
  void properties() {
    global(kMd, "TensorProperties");
    s += ")\x81(";
    global("torch", "float32");
    global("torch.serialization", "_get_layout");
    str("torch.strided");
    s += "\x85R\x89";  // TUPLE1 REDUCE NEWFALSE
    global(kMd, "_MEM_FORMAT_ENCODING");
    integer(0);
    s += "\x85R\x89tb";  // TUPLE1 REDUCE NEWFALSE TUPLE BUILD
  }
};

inline std::string metadata(const std::vector<Tensor>& tensors, const std::string& extra_global = "") {
  Writer w;
  std::map<std::string, std::int64_t> file_end;
  w.dataclass(kMd, "Metadata", [&] {
    w.str("state_dict_metadata");
    w.s += "}(";
    for (const auto& t : tensors) {
      w.str(t.fqn);
      w.dataclass(kMd, "TensorStorageMetadata", [&] {
        w.str("properties");
        w.properties();
        w.str("size");
        w.size(t.shape);
        w.str("chunks");
        w.s += "](";
        for (const auto& c : t.chunks)
          w.dataclass(kMd, "ChunkStorageMetadata", [&] {
            w.str("offsets");
            w.size(c.offsets);
            w.str("sizes");
            w.size(c.sizes);
          });
        w.s += "e";  // APPENDS
      });
    }
    w.s += "u";
    w.str("storage_data");
    w.s += "}(";
    for (const auto& t : tensors)
      for (const auto& c : t.chunks) {
        w.dataclass(kMd, "MetadataIndex", [&] {
          w.str("fqn");
          w.str(t.fqn);
          w.str("offset");
          w.size(c.offsets);
          w.str("index");
          w.s += 'N';
        });
        w.dataclass("torch.distributed.checkpoint.filesystem", "_StorageInfo", [&] {
          w.str("relative_path");
          w.str(c.file);
          w.str("offset");
          std::int64_t& end = file_end[c.file];
          const std::int64_t at = c.offset >= 0 ? c.offset : end;
          end = std::max(end, at + c.length);
          w.integer(at);
          w.str("length");
          w.integer(c.length);
        });
      }
    w.s += "u";
    if (!extra_global.empty()) {
      w.str("version");
      w.global(extra_global.substr(0, extra_global.rfind('.')), extra_global.substr(extra_global.rfind('.') + 1));
    }
  });
  w.s += '.';
  return w.s;
}

}  // namespace dcp_test
