# Pointed at by CLI11_DIR in the subproject check: safeckpt as a subproject
# must not look for CLI11 (nor Google Benchmark).
message(FATAL_ERROR "safeckpt searched for Google Benchmark although its benchmarks are not built")
