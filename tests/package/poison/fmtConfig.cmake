# Pointed at by fmt_DIR in the subproject check: safeckpt as a subproject
# must not look for fmt (only its CLI needs it).
message(FATAL_ERROR "safeckpt searched for fmt although its tools are not built")
