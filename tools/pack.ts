/**
 * `mod.ts pack <hf-dir> <out>.sluice [--convert f32|bf16] [--experts FORMAT] [--trunk int8]
 * [--force]` (also `deno task pack`): packs a Hugging Face checkpoint into a sluice container (docs/FORMAT.md). Streams
 * tensor by tensor with bounded buffers (an expert matrix at a time when quantising), trains the
 * VQ3R codebooks of each MoE layer when asked, writes into `<out>.tmp/` and renames it into place
 * at the end, and resumes an interrupted pack layer by layer from the journal kept in the
 * temporary directory.
 *
 * This file is the command line and the public face of the packer; the work is done in
 * tools/pack/: options.ts (what can be asked), layout.ts (what goes where), journal.ts (resuming),
 * trunk_writer.ts, codebook_trainer.ts, bank_writer.ts, manifest_writer.ts (writing), and
 * pack_checkpoint.ts (the run that ties them together).
 *
 * @module
 */

import { existsSync } from "node:fs";
import { join } from "node:path";
import { SUPPORTED_MODEL_TYPES } from "../engine/config.ts";
import { EXPERT_OPTIONS } from "../engine/quant/mod.ts";
import { HELP_FLAG, helpShown, parseCommandArgs } from "./cli/args.ts";
import { JOURNAL } from "./pack/journal.ts";
import { resumeHint } from "./pack/finite.ts";
import { PACK_FLAGS, packOptionsFromArgs } from "./cli/pack_flags.ts";
import { packCheckpoint } from "./pack/pack_checkpoint.ts";

export { packCheckpoint } from "./pack/pack_checkpoint.ts";
export {
  EXPERT_OPTIONS,
  type ExpertsOption,
  type PackOptions,
  type PackResult,
  type Vq3rPackOptions,
} from "./pack/options.ts";

const USAGE = `sluice pack — turn a Hugging Face safetensors checkpoint into a .sluice container

Usage: deno run -A mod.ts pack <hf-dir> <out>.sluice [options]   (or: deno task pack ...)

Reads single-file or sharded checkpoints (F32, F16, BF16, FP8 E4M3 with 128×128 block scales,
Kimi-style INT4) of model_type ${SUPPORTED_MODEL_TYPES.join(", ")}. Writes into
<out>.sluice.tmp and renames at the end; an interrupted pack resumes layer by layer on rerun.

Options:
  --experts FORMAT      store routed experts as ${Object.keys(EXPERT_OPTIONS).join(", ")}
                        (default: as shipped); matrices a format cannot hold keep their dtype
  --trunk int8          per-row int8 for the layers' attention/dense matrices
  --no-mtp              leave out the multi-token-prediction layers (no --spec mtp)
  --convert f32|bf16    dequantise / convert every weight matrix
  --vq3r-sample N       vectors sampled to train each VQ3R / VQ4P codebook
  --vq3r-iterations N   k-means iterations per VQ3R / VQ4P stage
  --vq3r-experts N      experts per layer whose rows train the VQ3R / VQ4P codebooks
  --force               replace an existing output
  -h, --help            this text

docs/FORMAT.md describes the container.`;

/** Runs the pack command with command-line `args`; returns the exit code. */
export async function packCommand(args: string[]): Promise<number> {
  let a;
  try {
    a = parseCommandArgs("pack", args, { ...PACK_FLAGS, ...HELP_FLAG }, { positionals: true });
  } catch (e) {
    console.error(`pack: ${(e as Error).message}\n${USAGE}`);
    return 1;
  }
  if (helpShown(a, USAGE)) return 0;
  if (a.positionals.length !== 2) {
    console.error(`pack: expected a checkpoint directory and an output path\n${USAGE}`);
    return 1;
  }
  const [src, out] = a.positionals;
  try {
    await packCheckpoint(src, out, packOptionsFromArgs(a));
    return 0;
  } catch (e) {
    const tmp = out + ".tmp";
    const hint = existsSync(join(tmp, JOURNAL)) ? resumeHint(e, `partial pack kept in ${tmp}`) : "";
    console.error(`pack: ${(e as Error).message}${hint}`);
    return 1;
  }
}

if (import.meta.main) Deno.exit(await packCommand(Deno.args));
