// A value of type T read from bytes at any alignment (wire formats, byte
// streams), in the host's byte order.
#ifndef TRAINYARD_CORE_UNALIGNED_H_
#define TRAINYARD_CORE_UNALIGNED_H_

#include <cstring>
#include <type_traits>

namespace trainyard {

template <typename T>
T LoadUnaligned(const void* p) {
  static_assert(std::is_trivially_copyable_v<T>);
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

}  // namespace trainyard

#endif  // TRAINYARD_CORE_UNALIGNED_H_
