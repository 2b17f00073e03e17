// @ts-self-types="./sqlite3_wasm_module.d.ts"
// The compiled sqlite3.wasm as a module import (a source phase import, which
// TypeScript cannot parse yet, hence this JavaScript file): Deno loads it as
// part of the module graph, so reading it needs no --allow-read.
import source sqlite3Wasm from "@sqlite.org/sqlite-wasm/sqlite3.wasm";

export default sqlite3Wasm;
