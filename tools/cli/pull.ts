/**
 * `mod.ts pull <org/name>[@revision] <out>.sluice`: download a Hugging Face Hub checkpoint shard by
 * shard and pack it as it arrives (tools/pull/), never holding the whole checkpoint on disk.
 *
 * @module
 */
import { existsSync, mkdirSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { storePath } from "./models.ts";
import { EXPERT_OPTIONS } from "../../engine/quant/mod.ts";
import { PACK_FLAGS, packOptionsFromArgs } from "./pack_flags.ts";
import { pullModel } from "../pull/pull.ts";
import { resumeHint } from "../pack/finite.ts";
import { HELP_FLAG, helpShown, parseCommandArgs } from "./args.ts";

const HELP = `sluice pull — a Hugging Face Hub checkpoint into a .sluice container, shard by shard

Usage: deno run -A mod.ts pull <org/name>[@revision] [<out>.sluice] [options]

Without <out>, the container goes into the model store (\$SLUICE_MODELS, else
~/.local/share/sluice/models) as <org>/<name>.sluice, where '-m org/name' and 'list' find it.

Downloads config, tokenizer and chat files, then the safetensors shards (HTTP Range resume, size
and sha256 checked), packing each layer as soon as the shards it reads are on disk, fetching the
next shard in the background when --keep-shards leaves room, and deleting a shard once no later
layer reads it. An interrupted pull (Ctrl-C, kill -9, network
loss) resumes on rerun from <out>.pull/ and the pack journal in <out>.tmp/.

Options:
  --keep-shards N       most complete shards on disk at once (default 2); the peak extra disk
                        this gives is printed before the download starts and checked against
                        the free space
  --experts FORMAT      store routed experts as ${Object.keys(EXPERT_OPTIONS).join(", ")}
  --trunk int8          per-row int8 for the layers' attention/dense matrices
  --no-mtp              leave out the multi-token-prediction layers (no --spec mtp)
  --convert f32|bf16    dequantise / convert every weight matrix
  --vq3r-sample N  --vq3r-iterations N  --vq3r-experts N   VQ3R training, as for pack
  --force               replace an existing output
  -h, --help            this text

Environment:
  HF_ENDPOINT           Hub base URL (default https://huggingface.co)
  HF_TOKEN              access token for private or gated repos (sent as a bearer token, never
                        printed)
`;

/** Runs the pull command; returns the exit code. */
export async function pullCommand(args: string[]): Promise<number> {
  const a = parseCommandArgs("pull", args, {
    "keep-shards": { type: "string" },
    ...PACK_FLAGS,
    ...HELP_FLAG,
  }, { positionals: true });
  if (helpShown(a, HELP)) return 0;
  if (a.positionals.length < 1 || a.positionals.length > 2) {
    console.error(`pull: expected a Hub repo and, optionally, an output path\n\n${HELP}`);
    return 2;
  }
  const [spec, given] = a.positionals;
  const out = given ?? storePath(spec);
  if (given === undefined) mkdirSync(dirname(out), { recursive: true });
  try {
    await pullModel(spec, out, { ...packOptionsFromArgs(a), keepShards: a.int("keep-shards", 1) });
  } catch (e) {
    const stage = `${resolve(out)}.pull`;
    if (!existsSync(stage)) throw e;
    throw new Error(`${(e as Error).message}${resumeHint(e, `downloads kept in ${stage}`)}`);
  }
  return 0;
}
