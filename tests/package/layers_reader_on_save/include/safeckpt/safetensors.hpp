// Fixture (never compiled): a safetensors header that includes the save layer.
#pragma once

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/save.hpp"
