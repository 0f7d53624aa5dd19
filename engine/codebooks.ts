/**
 * VQ3R / VQ4P codebooks in the arena. A container with vq3r or vq4p experts has codebooks.bin
 * (one f32 [3][8][256] or [4][8][64] set per MoE layer and matrix kind, docs/FORMAT.md); the
 * engine keeps all of it resident (24 or 8 KiB per set) and binds each such expert matrix to its
 * layer's set.
 *
 * @module
 */
import { alignUp } from "../io/format.ts";
import { allBanks, type Container, readCodebooks } from "../io/container.ts";
import type { ExpertBank } from "../io/container.ts";
import { EXPERT_MATRICES, type ExpertMatrix } from "../io/model_config.ts";
import type { Arena } from "./arena.ts";
import { PAGE } from "./arena.ts";

/** Arena address of each loaded codebook set, by bank (manifest object) and matrix kind. */
const loaded = new WeakMap<ExpertBank, Partial<Record<ExpertMatrix, number>>>();

/** Arena bytes {@link loadCodebooks} takes for a container's manifest (0 without vq3r or vq4p). */
export function codebookArenaBytes(c: Container): number {
  const bytes = c.manifest.codebooks?.bytes ?? 0;
  return bytes ? alignUp(bytes, PAGE) : 0;
}

/**
 * Copies every codebook set of the container into one arena region, checking each CRC, and
 * records where they are for {@link codebookPointer}. Does nothing when the container has no
 * vq3r matrices.
 */
export function loadCodebooks(c: Container, arena: Arena): void {
  const bytes = codebookArenaBytes(c);
  if (!bytes) return;
  const base = arena.alloc("expert codebooks", bytes);
  allBanks(c.manifest).forEach((bank, layer) => {
    if (!bank?.codebooks) return;
    const where: Partial<Record<ExpertMatrix, number>> = {};
    for (const m of EXPERT_MATRICES) {
      const ref = bank.codebooks[m];
      if (!ref) continue;
      arena.f32(base + ref.offset, ref.bytes / 4).set(readCodebooks(c, layer, m));
      where[m] = base + ref.offset;
    }
    loaded.set(bank, where);
  });
}

/** Arena address of the codebooks of `bank`'s matrix `m`; throws when they were not loaded. */
export function codebookPointer(bank: ExpertBank, m: ExpertMatrix): number {
  const p = loaded.get(bank)?.[m];
  if (p === undefined) {
    throw new Error(
      `layer ${bank.layer} ${m}: codebooks are not in the arena (loadCodebooks was not run)`,
    );
  }
  return p;
}
