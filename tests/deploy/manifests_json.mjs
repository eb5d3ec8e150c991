// Prints the objects of rendered Kubernetes manifests as one JSON array, so
// that checks can read them with Python's standard library alone (the yaml
// package comes from the npm install helm_checks.sh does).
//
//   node manifests_json.mjs NODE_MODULES_DIR FILE.yaml > FILE.json
//
// Exits 1 naming the file on a YAML error.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, file] = process.argv.slice(2);
if (!modules || !file) {
  console.error("usage: node manifests_json.mjs NODE_MODULES_DIR FILE.yaml");
  process.exit(2);
}
const { parseAllDocuments } = await import(
  pathToFileURL(path.join(modules, "yaml/dist/index.js")).href);

const objects = [];
for (const doc of parseAllDocuments(fs.readFileSync(file, "utf8"))) {
  if (doc.errors.length) {
    console.error(`${file}: YAML: ${doc.errors[0].message}`);
    process.exit(1);
  }
  const obj = doc.toJS();
  if (obj !== null && obj !== undefined) objects.push(obj);
}
console.log(JSON.stringify(objects));
