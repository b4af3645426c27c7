# cmake -DIN=ops.schema -DOUT=file.cpp -P embed_ops.cmake
# Writes `extern const char kOpsAllowlist[]` holding allowlist/ops.schema as a
# raw string (the engine's op allowlist, src/graph/schema.cpp).
file(READ ${IN} _text)
string(FIND "${_text}" ")SCK_OPS" _pos)
if(NOT _pos EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter")
endif()
file(WRITE ${OUT} "// Generated from allowlist/ops.schema by allowlist/embed_ops.cmake. Do not edit.\nnamespace safeckpt::detail {\nextern const char kOpsAllowlist[];\nconst char kOpsAllowlist[] = R\"SCK_OPS(${_text})SCK_OPS\";\n}  // namespace safeckpt::detail\n")
