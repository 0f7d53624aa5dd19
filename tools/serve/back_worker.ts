/**
 * The engine worker of the worker server: ./front.ts starts it, ./back.ts does the work.
 *
 * @module
 */
import { runBack } from "./back.ts";

runBack();
