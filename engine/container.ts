/**
 * Opening a container with the engine's knowledge of model families: io/ checks the container
 * format, and the family (engine/tensor_names.ts) says which tensors each layer must hold.
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
import { layerTensorsOf } from "./tensor_names.ts";

/** Opens a container directory and validates its manifest against its files and its family. */
export function openContainer(path: string): Container {
  return readContainer(path, layerTensorsOf);
}

/** Parses and validates a manifest object against the files of `dir` and the model's family. */
export function parseManifest(raw: unknown, dir: string): Manifest {
  return parseWith(raw, dir, layerTensorsOf);
}
