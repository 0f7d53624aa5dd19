/**
 * The shim reader asks for transparent huge pages over the memory it fills (io/shim.c
 * sio_advise_huge): faulting in fresh 4 KiB pages inside O_DIRECT reads halved their rate. On
 * Linux with THP in `madvise` or `always` mode, the mapping holding the arena must be eligible once
 * a shim reader is open on it, and reads into it must still land the file's bytes. Skipped where
 * the shim, Linux or THP is missing.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { openReader } from "../io/reader.ts";
import { shimUnavailable } from "../io/shim.ts";
import { sharedMemory64 } from "../wasm/mod.ts";
import { skipIf } from "./skips.ts";

const MiB = 1024 * 1024;

function thpMode(): string | null {
  try {
    const text = Deno.readTextFileSync("/sys/kernel/mm/transparent_hugepage/enabled");
    return /\[(\w+)\]/.exec(text)?.[1] ?? null;
  } catch {
    return null;
  }
}

/** The smaps block of the mapping holding `address`. */
function mappingOf(address: bigint): string {
  for (
    const block of Deno.readTextFileSync("/proc/self/smaps").split(/\n(?=[0-9a-f]+-[0-9a-f]+ )/)
  ) {
    const [lo, hi] = block.split(" ")[0].split("-").map((x) => BigInt(`0x${x}`));
    if (address >= lo && address < hi) return block;
  }
  throw new Error(`no mapping holds ${address.toString(16)}`);
}

const memory = sharedMemory64(16 * MiB);
const mode = thpMode();
const why = Deno.build.os !== "linux"
  ? "not Linux"
  : mode === null || mode === "never"
  ? `transparent huge pages ${mode ?? "absent"}`
  : shimUnavailable(memory);

Deno.test({
  name: `shim reader: the arena it fills is eligible for huge pages${
    why ? ` (skipped: ${why})` : ""
  }`,
  ignore: skipIf(why !== null, `need huge pages and the I/O shim (${why})`),
  fn() {
    const base = BigInt(
      Deno.UnsafePointer.value(Deno.UnsafePointer.of(new Uint8Array(memory.buffer))),
    );
    const dir = Deno.makeTempDirSync({ prefix: "sluice-thp-test-" });
    try {
      const path = join(dir, "data.bin");
      const data = new Uint8Array(8 * MiB);
      for (let i = 0; i < data.length; i += 65536) {
        crypto.getRandomValues(data.subarray(i, i + 65536));
      }
      Deno.writeFileSync(path, data);
      const reader = openReader(memory, { quiet: true });
      try {
        assert.match(mappingOf(base), /THPeligible:\s+1/);
        const h = reader.open(path);
        for (let o = 0; o < data.length; o += 2 * MiB) reader.read(h, 4 * MiB + o, 2 * MiB, o);
        reader.closeFile(h);
      } finally {
        reader.close();
      }
      assert.deepEqual(new Uint8Array(memory.buffer, 4 * MiB, data.length), data);
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  },
});
