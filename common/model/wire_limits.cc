#include "common/model/wire_limits.h"

#include "absl/strings/str_cat.h"
#include "common/base/tensor_codec.h"

#include <vector>

namespace tessera {

absl::StatusOr<int64_t> CheckedElements(absl::Span<const int64_t> shape, absl::string_view what) {
  if (shape.size() > static_cast<size_t>(kMaxDimensions)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", shape.size(), " dimensions, at most ", kMaxDimensions, " allowed"));
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dimensions must be positive, got ", ShapeString(shape)));
    }
    // n * d > limit, asked without computing the product.
    if (d > kMaxParameterElements / n) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shape ", ShapeString(shape), " has more than ",
                                                     kMaxParameterElements, " elements"));
    }
    n *= d;
  }
  return n;
}

absl::Status CheckLength(absl::string_view field, absl::string_view value, size_t limit) {
  if (value.size() <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", value.size(), " bytes long; at most ", limit, " allowed"));
}

absl::Status CheckKnownEnums(const google::protobuf::Message& message) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);  // only the fields that are set
  for (const FieldDescriptor* field : fields) {
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
      const int n = field->is_repeated() ? reflection->FieldSize(message, field) : 1;
      for (int i = 0; i < n; ++i) {
        const int value = field->is_repeated() ? reflection->GetRepeatedEnumValue(message, field, i)
                                               : reflection->GetEnumValue(message, field);
        if (field->enum_type()->FindValueByNumber(value) == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(field->full_name(), ": ", value, " is not a value of ",
                                                         field->enum_type()->full_name()));
        }
      }
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (field->is_map()) continue;  // Tessera's maps hold no enums
      if (field->is_repeated()) {
        for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
          if (absl::Status s = CheckKnownEnums(reflection->GetRepeatedMessage(message, field, i)); !s.ok()) return s;
        }
      } else if (absl::Status s = CheckKnownEnums(reflection->GetMessage(message, field)); !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Duration BoundedWait(uint64_t milliseconds, absl::Duration fallback) {
  if (milliseconds == 0) return fallback;
  if (milliseconds >= static_cast<uint64_t>(absl::ToInt64Milliseconds(kMaxWait))) return kMaxWait;
  return absl::Milliseconds(static_cast<int64_t>(milliseconds));
}

}  // namespace tessera
