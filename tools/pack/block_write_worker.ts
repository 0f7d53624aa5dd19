/**
 * The packer's write-behind thread (tools/pack/block_writer.ts): opens, writes and syncs the files
 * it is told to, from the shared staging slots, so the pack's own thread reads and encodes the next
 * slot meanwhile. A slot is handed back (its state set to 0) once written. The first failure is
 * kept in the shared error area and every later request is skipped until the pack ends.
 *
 * @module
 */

import { closeSync, constants, fdatasyncSync, openSync, writeSync } from "node:fs";
import { CTL_DONE, CTL_ERROR, type WriteRequest, type WriterSetup } from "./block_writer.ts";

const self = globalThis as unknown as Worker;
let setup: WriterSetup | null = null;
let ctl: Int32Array;
const fds = new Map<number, number>();

function fail(e: unknown): void {
  if (Atomics.load(ctl, CTL_ERROR)) return;
  const err = e as { code?: string; message?: string };
  const text = new TextEncoder().encode(JSON.stringify([err.code ?? "", err.message ?? `${e}`]));
  const area = new Uint8Array(setup!.errorBuffer);
  const n = Math.min(text.length, area.length - 4);
  new DataView(setup!.errorBuffer).setUint32(0, n, true);
  area.set(text.subarray(0, n), 4);
  Atomics.store(ctl, CTL_ERROR, 1);
}

function open(req: Extract<WriteRequest, { op: "open" }>): void {
  const flags = constants.O_WRONLY | (req.create ? constants.O_CREAT | constants.O_TRUNC : 0);
  if (req.direct) {
    try {
      fds.set(req.id, openSync(req.path, flags | constants.O_DIRECT));
      return;
    } catch (e) {
      // O_DIRECT refused by the file system (tmpfs, some FUSE mounts): the page cache, then.
      if ((e as { code?: string }).code !== "EINVAL") throw e;
    }
  }
  fds.set(req.id, openSync(req.path, flags));
}

function handle(req: WriteRequest): void {
  if (req.op === "open") return open(req);
  const fd = fds.get(req.id)!;
  if (req.op === "write") {
    const s = setup!;
    const slot = new Uint8Array(s.stages, s.stageOffset + req.slot * s.stageBytes, req.len);
    for (let done = 0; done < req.len;) {
      done += writeSync(fd, slot, done, req.len - done, req.pos + done);
    }
    return;
  }
  if (fd === undefined) return;
  fds.delete(req.id);
  try {
    if (req.sync && !Atomics.load(ctl, CTL_ERROR)) fdatasyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

self.onmessage = (ev: MessageEvent<WriterSetup | WriteRequest>) => {
  if (!setup) {
    setup = ev.data as WriterSetup;
    ctl = new Int32Array(setup.control);
    return;
  }
  const req = ev.data as WriteRequest;
  try {
    if (!Atomics.load(ctl, CTL_ERROR) || req.op === "close") handle(req);
  } catch (e) {
    fail(e);
  }
  if (req.op === "write") {
    Atomics.store(ctl, req.slot, 0);
    Atomics.notify(ctl, req.slot);
  } else if (req.op === "close") {
    Atomics.add(ctl, CTL_DONE, 1);
    Atomics.notify(ctl, CTL_DONE);
  }
};
