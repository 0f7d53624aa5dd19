/**
 * The flags of every command that packs (pack, pull): declared once for the one argument parser
 * (./args.ts) and read into {@link PackOptions}.
 *
 * @module
 */
import type { PackOptions } from "../pack/options.ts";
import type { Args, Flags } from "./args.ts";

/** The pack flags: formats, codebook training, --force. */
export const PACK_FLAGS: Flags = {
  convert: { type: "string" },
  experts: { type: "string" },
  trunk: { type: "string" },
  "vq3r-sample": { type: "string" },
  "vq3r-iterations": { type: "string" },
  "vq3r-experts": { type: "string" },
  force: { type: "boolean" },
  "no-mtp": { type: "boolean" },
};

/** The pack options of {@link PACK_FLAGS} (the packer checks their values). */
export function packOptionsFromArgs(a: Args): PackOptions {
  return {
    convert: a.str("convert") as PackOptions["convert"],
    experts: a.str("experts") as PackOptions["experts"],
    trunk: a.str("trunk") as PackOptions["trunk"],
    vq3r: {
      sampleSize: a.int("vq3r-sample", 1),
      iterations: a.int("vq3r-iterations", 1),
      trainExperts: a.int("vq3r-experts", 1),
    },
    force: a.bool("force"),
    ...(a.bool("no-mtp") ? { mtp: false } : {}),
  };
}
