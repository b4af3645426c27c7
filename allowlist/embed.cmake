# cmake -DIN=file -DOUT=file.cpp -P embed.cmake
# Writes `extern const char kDefaultAllowlist[]` holding the file's text as a
# raw string (the data file never contains the delimiter ")SCK_ALLOW").
file(READ ${IN} _text)
string(FIND "${_text}" ")SCK_ALLOW" _pos)
if(NOT _pos EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter")
endif()
file(WRITE ${OUT} "// Generated from allowlist/default.allow by allowlist/embed.cmake. Do not edit.\nnamespace safeckpt::detail {\nextern const char kDefaultAllowlist[];\nconst char kDefaultAllowlist[] = R\"SCK_ALLOW(${_text})SCK_ALLOW\";\n}  // namespace safeckpt::detail\n")
