// User test finding: truncating a file between open and parse killed the
// process with SIGBUS (an access past the new end of a mapping). Files of at
// most 1 MiB (kReadSmallBytes, src/util/mapped_file.cpp) are read at open()
// now, so the parse sees the bytes that were opened; larger files stay mapped
// and the limit stands for them.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/mapped_file.hpp"

namespace fs = std::filesystem;

TEST_CASE("mapped file: a small checkpoint truncated after open still loads as opened, no SIGBUS") {
  const fs::path src = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11" / "mlp_state_dict.pt";
  REQUIRE(fs::file_size(src) <= (1u << 20));
  const fs::path p = fs::temp_directory_path() / ("safeckpt_trunc_" + std::to_string(::getpid()) + ".pt");
  fs::copy_file(src, p, fs::copy_options::overwrite_existing);
  auto expect = safeckpt::load(src);
  REQUIRE(expect.has_value());

  auto mf = safeckpt::MappedFile::open(p);
  REQUIRE(mf.has_value());
  const std::size_t opened = mf->size();
  fs::resize_file(p, 100);  // the file now ends inside the zip's first record
  auto r = safeckpt::load_file(std::move(*mf));
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  CHECK(r->file().size() == opened);
  CHECK(r->state_dict().size() == expect->state_dict().size());
  for (std::uint32_t i = 0; i < r->tensors().size(); ++i)
    CHECK(*r->contiguous_bytes(i) == *expect->contiguous_bytes(i));
  fs::remove(p);
}
