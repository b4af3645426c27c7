# Pointed at by CLI11_DIR in the subproject check: safeckpt as a subproject
# must not look for CLI11 (only its CLI needs it).
message(FATAL_ERROR "safeckpt searched for CLI11 although its tools are not built")
