/**
 * The NaN / infinity scan of every weight a pack writes: one such value turns every logit into
 * NaN downstream (greedy then picks token 0 forever), so the pack refuses it, naming the tensor
 * and the element.
 *
 * @module
 */

/** Bit mask and pattern of the all-ones exponent (infinity or NaN) of each float dtype. */
const NON_FINITE: Record<string, { bytes: 1 | 2 | 4; mask: number }> = {
  F32: { bytes: 4, mask: 0x7f800000 },
  BF16: { bytes: 2, mask: 0x7f80 },
  F16: { bytes: 2, mask: 0x7c00 },
  // E4M3 has no infinity; S.1111.111 is its NaN.
  F8_E4M3: { bytes: 1, mask: 0x7f },
};

/**
 * Throws when `bytes` (little-endian values of safetensors dtype `dtype`) hold a NaN or an
 * infinity; `first` is the element index of bytes[0] within the tensor, for the message.
 */
export function checkFinite(bytes: Uint8Array, dtype: string, what: string, first = 0): void {
  const spec = NON_FINITE[dtype];
  if (!spec) return;
  const n = Math.floor(bytes.length / spec.bytes);
  const aligned = bytes.byteOffset % spec.bytes === 0;
  const src = aligned ? bytes : bytes.slice();
  const view = spec.bytes === 4
    ? new Uint32Array(src.buffer, src.byteOffset, n)
    : spec.bytes === 2
    ? new Uint16Array(src.buffer, src.byteOffset, n)
    : src;
  const { mask } = spec;
  for (let i = 0; i < n; i++) {
    if ((view[i] & mask) === mask) {
      throw new Error(
        `${what}: element ${first + i} is NaN or infinite; sluice refuses weights that would ` +
          `make every output NaN`,
      );
    }
  }
}

/** {@link checkFinite} for float32 values. */
export function checkFiniteF32(x: Float32Array, what: string, first = 0): void {
  checkFinite(new Uint8Array(x.buffer, x.byteOffset, x.byteLength), "F32", what, first);
}
