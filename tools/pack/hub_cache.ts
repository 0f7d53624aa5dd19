/**
 * A Hugging Face Hub cache folder as a pack source: `models--org--name/` keeps each revision in
 * `snapshots/<commit>/` as symlinks into `blobs/`, and names the commit of `main` in `refs/main`.
 * Files are read through the symlinks, so nothing is copied.
 *
 * @module
 */

import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";

/**
 * The checkpoint folder `src` stands for: `src` itself when it holds a config.json, else the
 * snapshot of a Hub cache folder (the commit `refs/main` names, or its only snapshot).
 */
export function checkpointDir(src: string): string {
  const snapshots = join(src, "snapshots");
  if (existsSync(join(src, "config.json")) || !existsSync(snapshots)) return src;
  const refMain = join(src, "refs", "main");
  if (existsSync(refMain)) {
    const commit = readFileSync(refMain, "utf8").trim();
    const dir = join(snapshots, commit);
    if (!existsSync(dir) || !statSync(dir).isDirectory()) {
      throw new Error(`${refMain} names commit ${commit}, but ${dir} does not exist`);
    }
    return dir;
  }
  const all = readdirSync(snapshots).filter((d) => statSync(join(snapshots, d)).isDirectory());
  if (all.length === 1) return join(snapshots, all[0]);
  throw new Error(
    `${src}: a Hub cache folder without refs/main and with ${all.length} snapshots ` +
      `(${all.join(", ") || "none"}); pass the snapshot folder itself`,
  );
}
