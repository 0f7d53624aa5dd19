/**
 * Moving a finished output folder into place: the last step of every writer that builds in a
 * temporary folder (pack, synth), so a reader never sees a half-written result.
 *
 * @module
 */
import { existsSync, renameSync, rmSync } from "node:fs";

/** Moves the finished `tmp` folder to `out`, replacing what is there. */
export function replaceDir(tmp: string, out: string): void {
  if (existsSync(out)) {
    const old = `${out}.old-${Deno.pid}`;
    renameSync(out, old);
    renameSync(tmp, out);
    rmSync(old, { recursive: true, force: true });
  } else {
    renameSync(tmp, out);
  }
}
