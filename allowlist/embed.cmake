# cmake -DIN=file -DOUT=file.cpp -DSYMBOL=kName -DDELIM=SCK_X -P embed.cmake
# Writes `extern const char SYMBOL[]` (namespace safeckpt::detail) holding the
# data file's text as a raw string delimited by DELIM; fails if the file
# contains ")DELIM". One script for every embedded policy file: default.allow
# (kDefaultAllowlist, the loader's and scanner's table) and ops.schema
# (kOpsAllowlist, the engine's op allowlist, src/graph/schema.cpp).
foreach(v IN ITEMS IN OUT SYMBOL DELIM)
  if(NOT ${v})
    message(FATAL_ERROR "embed.cmake: -D${v}= is required")
  endif()
endforeach()
file(READ ${IN} _text)
string(FIND "${_text}" ")${DELIM}" _pos)
if(NOT _pos EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter")
endif()
get_filename_component(_name ${IN} NAME)
file(WRITE ${OUT} "// Generated from allowlist/${_name} by allowlist/embed.cmake. Do not edit.\nnamespace safeckpt::detail {\nextern const char ${SYMBOL}[];\nconst char ${SYMBOL}[] = R\"${DELIM}(${_text})${DELIM}\";\n}  // namespace safeckpt::detail\n")
