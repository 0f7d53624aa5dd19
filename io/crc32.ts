/**
 * CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), the checksum of zlib, PNG and gzip.
 * Slicing-by-8 tables keep it near a byte per cycle in JS; `prev` continues a running CRC.
 *
 * @module
 */

const POLY = 0xedb88320;

/** TABLES[k][b]: CRC of byte b followed by k zero bytes. */
const TABLES: Uint32Array[] = (() => {
  const t = Array.from({ length: 8 }, () => new Uint32Array(256));
  for (let b = 0; b < 256; b++) {
    let c = b;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ POLY : c >>> 1;
    t[0][b] = c >>> 0;
  }
  for (let b = 0; b < 256; b++) {
    for (let k = 1; k < 8; k++) t[k][b] = (t[k - 1][b] >>> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
})();

/** CRC-32 of `bytes`; pass the previous result as `prev` to checksum data in pieces. */
export function crc32(bytes: Uint8Array, prev = 0): number {
  const [t0, t1, t2, t3, t4, t5, t6, t7] = TABLES;
  let c = ~prev >>> 0;
  let i = 0;
  const n8 = bytes.length - 8;
  for (; i <= n8; i += 8) {
    const lo =
      (c ^ (bytes[i] | (bytes[i + 1] << 8) | (bytes[i + 2] << 16) | (bytes[i + 3] << 24))) >>> 0;
    const hi = bytes[i + 4] | (bytes[i + 5] << 8) | (bytes[i + 6] << 16) | (bytes[i + 7] << 24);
    c = t7[lo & 0xff] ^ t6[(lo >>> 8) & 0xff] ^ t5[(lo >>> 16) & 0xff] ^ t4[lo >>> 24] ^
      t3[hi & 0xff] ^ t2[(hi >>> 8) & 0xff] ^ t1[(hi >>> 16) & 0xff] ^ t0[hi >>> 24];
  }
  for (; i < bytes.length; i++) c = (c >>> 8) ^ t0[(c ^ bytes[i]) & 0xff];
  return ~c >>> 0;
}
