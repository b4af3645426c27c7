#include "safeckpt/error.hpp"

#include <string>

namespace safeckpt {

std::string_view error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kMalformed: return "malformed";
    case ErrorCode::kLimitExceeded: return "limit_exceeded";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kDisallowedGlobal: return "disallowed_global";
    case ErrorCode::kDisallowedOperation: return "disallowed_operation";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kDevice: return "device";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kInternal: return "internal";
    case ErrorCode::kExists: return "exists";
    case ErrorCode::kIntegrity: return "integrity";
  }
  return "unknown";
}

Error& Error::at_record(std::string_view record) {
  if (where_.record.empty()) where_.record = std::string(record);
  return *this;
}
Error& Error::at_offset(std::uint64_t offset) {
  if (where_.offset == Location::kNoOffset) where_.offset = offset;
  return *this;
}
Error& Error::at_opcode(std::string_view opcode) {
  if (where_.opcode.empty()) where_.opcode = std::string(opcode);
  return *this;
}

std::string Error::to_string() const {
  std::string s(error_code_name(code_));
  s += ": ";
  s += message_;
  std::string loc;
  auto add = [&](const std::string& part) {
    if (!loc.empty()) loc += ", ";
    loc += part;
  };
  if (!where_.record.empty()) add("record " + where_.record);
  if (where_.offset != Location::kNoOffset) add("offset " + std::to_string(where_.offset));
  if (!where_.opcode.empty()) add("opcode " + where_.opcode);
  if (!loc.empty()) s += " [" + loc + "]";
  return s;
}

}  // namespace safeckpt
