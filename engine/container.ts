/**
 * Opening a container with the engine's knowledge of model families: io/ checks the container
 * format, and the family registry (engine/models/mod.ts) checks the config's family sections and
 * says which tensors each layer must hold. Everything that opens a container goes through here.
 *
 * @module
 */
import {
  type Container,
  type FamilyRules,
  type Manifest,
  parseManifest as parseWith,
  readContainer,
} from "../io/container.ts";
import { manifestField } from "../io/manifest.ts";
import { FAMILIES } from "./models/mod.ts";
import { layerTensorsOf } from "./tensor_names.ts";

/** The family registry, as the container format asks for it. */
export const FAMILY_RULES: FamilyRules = {
  validateFamily(c, where) {
    const name = manifestField.oneOf(c.family, Object.keys(FAMILIES), `${where}.family`);
    FAMILIES[name].validateConfig(c, where);
  },
  layerTensors: layerTensorsOf,
};

/** Opens a container directory and validates its manifest against its files and its family. */
export function openContainer(path: string): Container {
  return readContainer(path, FAMILY_RULES);
}

/** Parses and validates a manifest object against the files of `dir` and the model's family. */
export function parseManifest(raw: unknown, dir: string): Manifest {
  return parseWith(raw, dir, FAMILY_RULES);
}
