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
  mkdirSync,
  openSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
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
import {
  dropDamagedWork,
  fingerprint,
  JOURNAL,
  type Journal,
  openJournal,
  saveJournal,
} from "./journal.ts";
import { buildManifest } from "./manifest_writer.ts";
import {
  checkFreeSpace,
  checkPackOutput,
  isContainerDir,
  isDiskFull,
  isPackTempDir,
  lockPackOutput,
} from "./output_guard.ts";
import { EXPERT_OPTIONS, packOptionKey, type PackOptions, type PackResult } from "./options.ts";
import {
  computeLayout,
  mtpKept,
  type PackLayout,
  reportFallbacks,
  reportSkippedLayers,
} from "./layout.ts";
import { checkTokenizer, copySideFiles } from "./side_files.ts";
import { checkpointDir } from "./hub_cache.ts";
import { writeRegion } from "./trunk_writer.ts";
import { PackWriter, STAGE_BYTES } from "./block_writer.ts";
import { KeptReader } from "./kept_reader.ts";

/** Packs the checkpoint in `src` into the container directory `out`. */
export async function packCheckpoint(
  src: string,
  out: string,
  opts: PackOptions = {},
): Promise<PackResult> {
  const t0 = performance.now();
  const optionKey = packOptionKey(opts);
  src = checkpointDir(src);
  checkPackOutput(src, out, opts.force ?? false);
  mkdirSync(dirname(resolve(out)), { recursive: true });
  const lock = lockPackOutput(out);
  try {
    // Checked again under the lock: another pack may have finished meanwhile.
    checkPackOutput(src, out, opts.force ?? false);
    return await packLocked(src, out, opts, t0, optionKey);
  } catch (e) {
    if (!isDiskFull(e)) throw e;
    const tmp = out + ".tmp";
    if (isPackTempDir(tmp)) rmSync(tmp, { recursive: true, force: true });
    throw new Error(
      `no space left on the disk of ${out}; removed the partial output ${tmp} ` +
        `(${(e as Error).message})`,
    );
  } finally {
    lock.release();
  }
}

async function packLocked(
  src: string,
  out: string,
  opts: PackOptions,
  t0: number,
  optionKey: string,
): Promise<PackResult> {
  const log = opts.log ?? ((s: string) => console.error(s));
  const chunk = opts.chunkBytes ?? 64 << 20;
  const convert = opts.convert;
  const ckpt = openCheckpoint(src);
  const cfg = mtpKept(loadModelConfig(src), ckpt, opts, log);
  let writer: PackWriter | null = null;
  let kept: KeptReader | null = null;
  try {
    const layout = computeLayout(cfg, ckpt, opts);
    // Started now, the write-behind worker loads while the source is checked.
    writer = await PackWriter.open(
      layout.banks.reduce((n, b) => Math.max(n, b?.stride ?? 0), STAGE_BYTES),
    );
    kept = new KeptReader(ckpt, writer.memory, writer.scan);
    await checkTokenizer(src, cfg, log);
    reportFallbacks(layout, log);
    reportSkippedLayers(cfg, ckpt, log);
    const fp = await fingerprint(src, ckpt);
    const tmp = out + ".tmp";
    checkFreeSpace(tmp, containerBytesOf(layout) - bytesUnder(tmp));
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
    // What finished writing is journaled once durable, without waiting: the worker goes on
    // writing the next file meanwhile, so the pipeline never drains at a file's end.
    const pending: { mark: number; commit: () => void }[] = [];
    const commitDurable = (wait: boolean) => {
      if (wait) writer!.settle();
      while (pending.length && writer!.durable(pending[0].mark)) pending.shift()!.commit();
    };
    // The caller may replace source files in beforeStep: drop the open descriptors after it.
    // It may also drop the shards of finished steps, so those are journaled first.
    const ready = async (step: "globals" | number) => {
      if (!opts.beforeStep) return;
      commitDurable(true);
      await opts.beforeStep(step);
      ckpt.close();
      kept!.closeFiles();
    };
    const resumed: number[] = [];
    const packed: number[] = [];
    /** Bytes kept from an earlier run (resumed), not written by this one. */
    let skipped = 0;
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
      if (journal.globals) {
        progress.skip(layout.globals.region.bytes);
        skipped += layout.globals.region.bytes;
      } else {
        await ready("globals");
        const { offset, bytes } = layout.globals.region;
        const globals = writeRegion(
          ckpt,
          writer,
          trunkPath,
          offset,
          bytes,
          [...layout.globals.items.values()],
          progress,
          chunk,
          kept,
        );
        pending.push({
          mark: writer.mark(),
          commit: () => {
            journal.globals = globals;
            saveJournal(tmp, journal);
          },
        });
      }
      for (let l = 0; l < layout.layers.length; l++) {
        if (journal.layers[l]) {
          resumed.push(l);
          progress.skip(bytesOf(l));
          skipped += bytesOf(l);
        } else {
          await ready(l);
          const lp = layout.layers[l];
          const run = writeRegion(
            ckpt,
            writer,
            trunkPath,
            lp.offset,
            lp.bytes,
            [...lp.items.values()],
            progress,
            chunk,
            kept,
          );
          const bank = layout.banks[l];
          let crcs: Journal["codebooks"][string] = {};
          const bankPath = bank ? join(tmp, expertBankFile(l)) : null;
          if (bank) {
            const trained = trainBankCodebooks(
              ckpt,
              l,
              bank,
              booksFd,
              opts.vq3r ?? {},
              log,
              bookCount,
            );
            if (booksFd >= 0) fdatasyncSync(booksFd);
            crcs = trained.crcs;
            const part = bankPath + ".part";
            writeBank(ckpt, writer, l, bank, part, progress, chunk, trained.books, kept);
          }
          // Once the trunk run and the bank are durable, the bank gets its name and the layer
          // its journal entry.
          pending.push({
            mark: writer.mark(),
            commit: () => {
              if (bankPath) {
                renameSync(bankPath + ".part", bankPath);
                journal.codebooks[l] = crcs;
              }
              journal.layers[l] = run;
              saveJournal(tmp, journal);
            },
          });
          packed.push(l);
          commitDurable(false);
        }
        if (opts.stopAfterLayer === l) {
          commitDurable(true);
          throw new Error(`pack stopped on request after layer ${l}; ${tmp} can be resumed`);
        }
      }
      commitDurable(true);
      progress.finish();
    } catch (e) {
      // Layers finished before the failure stay journaled, for the resume.
      try {
        commitDurable(true);
      } catch {
        // The failure being handled is the one to report.
      }
      throw e;
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
    if (existsSync(out) && !isContainerDir(out)) {
      throw new Error(`${out} changed into something that is not a sluice container; not replaced`);
    }
    replaceDir(tmp, out);
    const containerBytes = containerBytesOf(layout);
    const seconds = (performance.now() - t0) / 1000;
    if (resumed.length) log(`pack: resumed ${resumed.length} finished layer(s) from ${tmp}`);
    // MB/s of what this run wrote: resumed layers were not rewritten.
    const written = containerBytes - skipped;
    log(
      `pack: wrote ${out} (${formatBytes(containerBytes)}) in ${seconds.toFixed(1)} s, ` +
        `${(written / seconds / 1e6).toFixed(0)} MB/s`,
    );
    return { out, manifest, layersPacked: packed, layersResumed: resumed, containerBytes, seconds };
  } finally {
    writer?.close();
    kept?.close();
    ckpt.close();
  }
}

/** Bytes of trunk.bin, codebooks.bin and every expert bank of a layout. */
function containerBytesOf(layout: PackLayout): number {
  return layout.trunkBytes + layout.codebooksBytes +
    layout.banks.reduce((n, b) => n + (b ? b.stride * b.experts.length : 0), 0);
}

/** Bytes allocated to the files directly in `dir` (0 when it does not exist): a resume's head start. */
function bytesUnder(dir: string): number {
  if (!existsSync(dir)) return 0;
  return readdirSync(dir).reduce((n, f) => n + statSync(join(dir, f)).blocks * 512, 0);
}
