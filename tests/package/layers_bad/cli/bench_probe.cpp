// Fixture for the ctest layers.detects_upward: the shipped CLI including a
// bench/ header must fail cmake/check_layers.cmake.
#include "probes.hpp"
