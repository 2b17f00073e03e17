/** The compiled `sqlite3.wasm` of `@sqlite.org/sqlite-wasm`, not yet instantiated. */
declare const sqlite3Wasm: WebAssembly.Module;
export default sqlite3Wasm;
