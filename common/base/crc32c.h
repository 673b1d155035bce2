// CRC-32C (Castagnoli), as used by iSCSI, ext4 and most storage formats; checks checkpoint files.
#ifndef TESSERA_COMMON_BASE_CRC32C_H_
#define TESSERA_COMMON_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera {

// The CRC-32C of `data`, continuing from `crc` (0 to start). Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(std::string_view data, uint32_t crc = 0);

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_CRC32C_H_
