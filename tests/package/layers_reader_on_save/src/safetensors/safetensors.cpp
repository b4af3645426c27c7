// Fixture for ctest layers.detects_reader_on_save: the safetensors reader
// includes only a safetensors header, but that header pulls in the save
// layer (the shape before issue 12's reader/writer split). Never compiled.
#include "safeckpt/safetensors.hpp"
