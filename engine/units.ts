/**
 * Byte counts for people: formatting for messages and stats, parsing for --budget and friends.
 *
 * @module
 */

/** "1.5 GiB"-style byte counts (binary units). */
export function formatBytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let u = 0;
  while (n >= 1024 && u < units.length - 1) {
    n /= 1024;
    u++;
  }
  return `${u === 0 ? n : n.toFixed(n < 10 ? 2 : 1)} ${units[u]}`;
}

/** Parses "6G", "512M", "1.5GiB", "4096" (bytes) into bytes; K/M/G/T are binary units. */
export function parseBytes(s: string): number {
  const m = /^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*$/i.exec(s);
  if (!m) throw new Error(`cannot read "${s}" as a size (examples: 6G, 512M, 1.5GiB)`);
  const mult = { "": 1, k: 2 ** 10, m: 2 ** 20, g: 2 ** 30, t: 2 ** 40 }[m[2].toLowerCase()]!;
  return Math.floor(parseFloat(m[1]) * mult);
}
