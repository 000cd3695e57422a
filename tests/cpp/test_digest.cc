// Known-answer and consistency tests for csrc/core/digest.{h,cc}.
// Standalone: exits non-zero and names each failing check.
#include "core/digest.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "check.h"

namespace r2ccl {
uint32_t crc32c_portable(uint32_t crc, const void*, size_t);
}

using namespace r2ccl;

namespace {

uint64_t g_rng = 0x9E3779B97F4A7C15ull;
uint64_t rnd() {  // splitmix64: deterministic, so failures reproduce
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<uint8_t> random_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rnd());
  return v;
}

std::string hex(const std::array<uint8_t, 32>& d) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

std::vector<uint8_t> unhex(const char* s) {
  std::vector<uint8_t> v;
  for (; s[0] && s[1]; s += 2) v.push_back(static_cast<uint8_t>(std::stoi(std::string(s, 2), nullptr, 16)));
  return v;
}

void check_digest(const std::array<uint8_t, 32>& got, const char* want, const std::string& what) {
  check(hex(got) == want, what + ": got " + hex(got) + " want " + want);
}

void test_crc32c() {
  check(crc32c("123456789", 9) == 0xE3069283u, "crc32c(\"123456789\")");
  check(crc32c_portable(0, "123456789", 9) == 0xE3069283u, "crc32c_portable(\"123456789\")");
  std::vector<uint8_t> zeros(32, 0x00), ones(32, 0xFF);
  check(crc32c(zeros.data(), 32) == 0x8A9136AAu, "crc32c(32 x 0x00)");
  check(crc32c(ones.data(), 32) == 0x62A8AB43u, "crc32c(32 x 0xFF)");
  check(crc32c(nullptr, 0) == 0, "crc32c(empty)");

  const auto buf = random_bytes(1000);
  const uint32_t whole = crc32c(buf.data(), buf.size());
  check(whole == crc32c_portable(0, buf.data(), buf.size()), "crc32c 1000B hw vs table");
  for (size_t split = 0; split <= buf.size(); ++split) {
    const uint32_t c = crc32c_extend(crc32c(buf.data(), split), buf.data() + split, buf.size() - split);
    if (c != whole) check(false, "crc32c_extend split at " + std::to_string(split));
  }

  // Table vs dispatched (hardware where available) path on odd lengths and offsets.
  std::vector<uint8_t> big = random_bytes(300 + 16);
  for (size_t len = 0; len <= 300; ++len) {
    for (int rep = 0; rep < 4; ++rep) {
      const size_t off = rnd() % 16;
      const uint32_t seed = static_cast<uint32_t>(rnd());
      const uint32_t a = crc32c_extend(seed, big.data() + off, len);
      const uint32_t b = crc32c_portable(seed, big.data() + off, len);
      if (a != b) check(false, "hw/table mismatch len=" + std::to_string(len) + " off=" + std::to_string(off));
    }
  }
}

void test_sha256() {
  check_digest(sha256("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "sha256(\"\")");
  check_digest(sha256("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "sha256(\"abc\")");
  const char* m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  check_digest(sha256(m448, std::strlen(m448)),
               "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", "sha256(448-bit msg)");
  const std::string million(1000000, 'a');
  check_digest(sha256(million.data(), million.size()),
               "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0", "sha256(1M x 'a')");

  // Streaming in random pieces, over lengths that straddle the padding boundaries.
  for (size_t len : {0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 1000, 4097}) {
    const auto msg = random_bytes(len);
    const auto want = sha256(msg.data(), msg.size());
    for (int rep = 0; rep < 8; ++rep) {
      Sha256 s;
      size_t pos = 0;
      while (pos < len) {
        const size_t n = std::min<size_t>(len - pos, rnd() % 150);
        s.update(msg.data() + pos, n);
        pos += n;
      }
      if (s.finish() != want) check(false, "sha256 streaming len=" + std::to_string(len));
    }
  }
}

void test_hmac() {
  struct Case {
    const char* name;
    std::vector<uint8_t> key;
    std::string data;
    const char* mac;
  };
  const std::vector<Case> cases = {
      {"RFC4231 #1", std::vector<uint8_t>(20, 0x0b), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"RFC4231 #2", {'J', 'e', 'f', 'e'}, "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {"RFC4231 #3", std::vector<uint8_t>(20, 0xaa), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {"RFC4231 #4", unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd'),
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {"RFC4231 #6", std::vector<uint8_t>(131, 0xaa), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {"RFC4231 #7", std::vector<uint8_t>(131, 0xaa),
       "This is a test using a larger than block-size key and a larger than block-size data. "
       "The key needs to be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (const auto& c : cases) {
    const ByteSpan one{c.data.data(), c.data.size()};
    const auto mac = hmac_sha256(c.key.data(), c.key.size(), &one, 1);
    check_digest(mac, c.mac, c.name);

    // Same message split into parts, including empty ones.
    const size_t n = c.data.size();
    const size_t a = n / 3, b = n / 2;
    const ByteSpan parts[] = {{c.data.data(), a}, {nullptr, 0}, {c.data.data() + a, b - a},
                              {c.data.data() + b, n - b}};
    check(hmac_sha256(c.key.data(), c.key.size(), parts, 4) == mac, std::string(c.name) + " split parts");
  }
}

void test_mac_equal() {
  std::array<uint8_t, 32> a{}, b{};
  for (size_t i = 0; i < 32; ++i) a[i] = b[i] = static_cast<uint8_t>(i * 7);
  check(mac_equal(a, b), "mac_equal identical");
  for (size_t i : {0, 15, 31}) {
    auto c = b;
    c[i] ^= 0x01;
    check(!mac_equal(a, c), "mac_equal differs at byte " + std::to_string(i));
  }
}

}  // namespace

int main() {
  test_crc32c();
  test_sha256();
  test_hmac();
  test_mac_equal();
  return checks_passed("test_digest");
}
