/**
 * Opening a container with the engine's knowledge of model families: io/ checks the container
 * format, and the family schema (engine/tensor_shapes.ts, with engine/tensor_names.ts) says which
 * tensors each layer must hold, in which shapes, and what config values are in bounds.
 * Everything that opens a container goes through here.
 *
 * @module
 */
import {
  type Container,
  type Manifest,
  parseManifest as parseWith,
  readContainer,
} from "../io/container.ts";
import { FAMILY_SCHEMA } from "./tensor_shapes.ts";

/** Opens a container directory and validates its manifest against its files and its family. */
export function openContainer(path: string): Container {
  return readContainer(path, FAMILY_SCHEMA);
}

/** Parses and validates a manifest object against the files of `dir` and the model's family. */
export function parseManifest(raw: unknown, dir: string): Manifest {
  return parseWith(raw, dir, FAMILY_SCHEMA);
}
