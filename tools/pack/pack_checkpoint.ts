/**
 * Runs a pack from start to finish: computes the layout, opens (or resumes) the journal in
 * `<out>.tmp/`, writes the globals and then layer by layer the trunk run, the VQ3R codebooks and
 * the expert bank, journaling each finished layer, and finally writes the manifest, copies the
 * tokenizer and config files and renames the directory into place.
 *
 * @module
 */

import {
  closeSync,
  existsSync,
  fdatasyncSync,
  ftruncateSync,
  openSync,
  renameSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { basename, join } from "node:path";
import { loadModelConfig } from "../../engine/config.ts";
import {
  CODEBOOKS_FILE,
  expertBankFile,
  type PackSettings,
  TRUNK_FILE,
} from "../../io/manifest_schema.ts";
import { openCheckpoint } from "../../io/safetensors.ts";
import { formatBytes, Progress } from "../progress.ts";
import { replaceDir } from "../replace_dir.ts";
import { writeBank } from "./bank_writer.ts";
import { trainBankCodebooks } from "./codebook_trainer.ts";
import { writeJson } from "../../io/json_file.ts";
import { dropDamagedWork, fingerprint, JOURNAL, openJournal, saveJournal } from "./journal.ts";
import { buildManifest } from "./manifest_writer.ts";
import { EXPERT_OPTIONS, packOptionKey, type PackOptions, type PackResult } from "./options.ts";
import { computeLayout, reportFallbacks } from "./layout.ts";
import { copySideFiles } from "./side_files.ts";
import { writeRegion } from "./trunk_writer.ts";

/** Packs the checkpoint in `src` into the container directory `out`. */
export async function packCheckpoint(
  src: string,
  out: string,
  opts: PackOptions = {},
): Promise<PackResult> {
  const t0 = performance.now();
  const log = opts.log ?? ((s: string) => console.error(s));
  const chunk = opts.chunkBytes ?? 64 << 20;
  const convert = opts.convert;
  const optionKey = packOptionKey(opts);
  if (existsSync(out) && !opts.force) {
    throw new Error(`${out} already exists; pass --force to replace it`);
  }
  const cfg = loadModelConfig(src);
  const ckpt = openCheckpoint(src);
  try {
    const layout = computeLayout(cfg, ckpt, opts);
    reportFallbacks(layout, log);
    const fp = await fingerprint(src, ckpt);
    const tmp = out + ".tmp";
    const journal = openJournal(
      tmp,
      { fingerprint: fp, convert: convert ?? null, options: optionKey },
      log,
    );
    const trunkPath = join(tmp, TRUNK_FILE);
    if (!existsSync(trunkPath)) writeFileSync(trunkPath, new Uint8Array(0));
    const fd = openSync(trunkPath, "r+");
    const booksPath = join(tmp, CODEBOOKS_FILE);
    if (layout.codebooksBytes > 0 && !existsSync(booksPath)) {
      writeFileSync(booksPath, new Uint8Array(0));
    }
    const booksFd = layout.codebooksBytes > 0 ? openSync(booksPath, "r+") : -1;
    const bookCount = {
      done: 0,
      total: layout.banks.reduce((n, b) => n + Object.keys(b?.codebookOffsets ?? {}).length, 0),
    };
    const resumed: number[] = [];
    const packed: number[] = [];
    try {
      ftruncateSync(fd, layout.trunkBytes);
      if (booksFd >= 0) ftruncateSync(booksFd, layout.codebooksBytes);
      dropDamagedWork(journal, layout, tmp, fd, booksFd, chunk);
      const bytesOf = (l: number) =>
        layout.layers[l].bytes +
        (layout.banks[l] ? layout.banks[l]!.stride * layout.banks[l]!.experts.length : 0);
      const total = layout.globals.region.bytes +
        layout.layers.reduce((n, _, l) => n + bytesOf(l), 0);
      const progress = new Progress({
        label: `pack ${basename(out)}`,
        total,
        mode: opts.progress ?? "auto",
      });
      if (journal.globals) progress.add(layout.globals.region.bytes);
      else {
        const { offset, bytes } = layout.globals.region;
        journal.globals = writeRegion(
          ckpt,
          fd,
          offset,
          bytes,
          [...layout.globals.items.values()],
          progress,
          chunk,
        );
        fdatasyncSync(fd);
        saveJournal(tmp, journal);
      }
      for (let l = 0; l < cfg.numLayers; l++) {
        if (journal.layers[l]) {
          resumed.push(l);
          progress.add(bytesOf(l));
        } else {
          const lp = layout.layers[l];
          const run = writeRegion(
            ckpt,
            fd,
            lp.offset,
            lp.bytes,
            [...lp.items.values()],
            progress,
            chunk,
          );
          fdatasyncSync(fd);
          const bank = layout.banks[l];
          if (bank) {
            const { books, crcs } = trainBankCodebooks(
              ckpt,
              l,
              bank,
              booksFd,
              opts.vq3r ?? {},
              log,
              bookCount,
            );
            if (booksFd >= 0) fdatasyncSync(booksFd);
            journal.codebooks[l] = crcs;
            const bankPath = join(tmp, expertBankFile(l));
            writeBank(ckpt, l, bank, bankPath + ".part", progress, chunk, books);
            renameSync(bankPath + ".part", bankPath);
          }
          journal.layers[l] = run;
          saveJournal(tmp, journal);
          packed.push(l);
        }
        if (opts.stopAfterLayer === l) {
          throw new Error(`pack stopped on request after layer ${l}; ${tmp} can be resumed`);
        }
      }
      progress.finish();
    } finally {
      closeSync(fd);
      if (booksFd >= 0) closeSync(booksFd);
    }

    const settings: PackSettings = {
      convert: convert ?? null,
      experts: opts.experts ? EXPERT_OPTIONS[opts.experts] : null,
      trunk: opts.trunk ? "int8row" : null,
    };
    const manifest = buildManifest(src, cfg, layout, journal, fp, settings);
    manifest.tokenizer.files = copySideFiles(src, tmp);
    writeJson(join(tmp, "manifest.json"), manifest);
    rmSync(join(tmp, JOURNAL));
    replaceDir(tmp, out);
    const containerBytes = layout.trunkBytes + layout.codebooksBytes +
      layout.banks.reduce((n, b) => n + (b ? b.stride * b.experts.length : 0), 0);
    const seconds = (performance.now() - t0) / 1000;
    if (resumed.length) log(`pack: resumed ${resumed.length} finished layer(s) from ${tmp}`);
    log(`pack: wrote ${out} (${formatBytes(containerBytes)}) in ${seconds.toFixed(1)} s`);
    return { out, manifest, layersPacked: packed, layersResumed: resumed, containerBytes, seconds };
  } finally {
    ckpt.close();
  }
}
