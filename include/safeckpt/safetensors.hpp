// safeckpt/safetensors.hpp — compatibility header: the safetensors reader
// (safeckpt/safetensors_reader.hpp) and writer/converter
// (safeckpt/safetensors_writer.hpp) together, as before the split (issue 12).
// New code includes the one it needs: the reader alone does not pull in the
// save layer.
#pragma once

#include "safeckpt/safetensors_reader.hpp"
#include "safeckpt/safetensors_writer.hpp"
