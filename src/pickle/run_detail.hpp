// Internal: run_pickle() for the loader's one-run refusals (issue 12).
//
// With PickleOptions::continue_after_policy_error a run that reaches STOP
// returns its first policy error in PickleResult::policy_error; a run that
// then fails on another error (a refused call followed by a broken stream,
// the nullifAI shape of docs/threats.md) returns only that error. A
// stop-at-first run would have returned the policy error, so the loader
// (src/checkpoint/load.cpp) needs it to report what a normal run reports
// without parsing the stream twice. Not in the public pickle.hpp: only the
// loader needs it.
#pragma once

#include <optional>

#include "safeckpt/pickle.hpp"

namespace safeckpt::detail {

// run_pickle(), and when the run fails, `*policy_error_before_failure` = the
// first policy error it met before failing (continue mode; empty otherwise
// or when there was none). `policy_error_before_failure` may be null.
Result<PickleResult> run_pickle_keeping_policy_error(Bytes data, ValueArena& arena, PickleHooks& hooks,
                                                     PickleObserver* observer, const PickleOptions& options,
                                                     std::optional<Error>* policy_error_before_failure);

}  // namespace safeckpt::detail
