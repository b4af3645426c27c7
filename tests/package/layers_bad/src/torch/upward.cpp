// Fixture for the ctest layers.detects_upward: the torch layer including the
// checkpoint layer's header must fail cmake/check_layers.cmake.
#include "safeckpt/checkpoint.hpp"
