// Internal, for tests: how many times run_pickle() has started on the
// calling thread. The scanner promises one machine run per pickle stream
// (issue 12); tests/scanner/test_scan_runs.cpp holds it to that.
#pragma once

#include <cstdint>

namespace safeckpt::detail {

// run_pickle() calls made on this thread since it started (never reset).
std::uint64_t pickle_runs_on_this_thread() noexcept;

}  // namespace safeckpt::detail
