// Parameter declarations for tests.
#ifndef TESSERA_TESTS_TESTING_PARAM_SPEC_H_
#define TESSERA_TESTS_TESTING_PARAM_SPEC_H_

#include <cstdint>
#include <string>

#include "proto/tensor.pb.h"

namespace tessera::testing {

// A float32 parameter of `elements` zeros.
inline tessera::v1::ParameterSpec FloatParam(const std::string& name, int64_t elements) {
  tessera::v1::ParameterSpec p;
  p.set_name(name);
  p.set_dtype(tessera::v1::DT_FLOAT32);
  p.add_shape(elements);
  return p;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_PARAM_SPEC_H_
