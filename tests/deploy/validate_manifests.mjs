// Validates rendered Kubernetes manifests offline against the API schemas
// of the npm package kubernetes-models (and @kubernetes-models/
// prometheus-operator for ServiceMonitor, @kubernetes-models/cert-manager for
// Certificate), with no cluster.
//
//   node validate_manifests.mjs NODE_MODULES_DIR FILE.yaml...
//
// Stricter than the packages alone: their JSON-schema validators check types,
// required fields and enums but let unknown fields through, so every object
// is wrapped in a Proxy that records which keys the validator looked at; a
// key it never read is a field the schema does not define (a typo, or a
// field of a newer API). Prints one line per object; exits 1 if any failed.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, ...files] = process.argv.slice(2);
if (!modules || files.length === 0) {
  console.error("usage: node validate_manifests.mjs NODE_MODULES_DIR FILE.yaml...");
  process.exit(2);
}
const { parseAllDocuments } = await import(
  pathToFileURL(path.join(modules, "yaml/dist/index.js")).href);

const packages = ["kubernetes-models", "@kubernetes-models/prometheus-operator",
  "@kubernetes-models/cert-manager"];

// The package's model module for apiVersion/kind names its schema module.
async function validatorFor(apiVersion, kind) {
  for (const pkg of packages) {
    const model = path.join(modules, pkg, apiVersion, `${kind}.js`);
    if (!fs.existsSync(model)) continue;
    const match = fs.readFileSync(model, "utf8").match(/_schemas\/(\w+)\.js/);
    if (!match) continue;
    const schema = path.join(modules, pkg, "_schemas", `${match[1]}.js`);
    return (await import(pathToFileURL(schema).href)).validate;
  }
  return null;
}

// Wraps value (recursively) so that reads of its keys are recorded in seen.
function track(value, where, seen) {
  if (value === null || typeof value !== "object") return value;
  const read = new Set();
  const target = Array.isArray(value)
    ? value.map((v, i) => track(v, `${where}/${i}`, seen))
    : Object.fromEntries(Object.entries(value).map(([k, v]) => [k, track(v, `${where}/${k}`, seen)]));
  if (!Array.isArray(value)) seen.push({ where, keys: Object.keys(value), read });
  return new Proxy(target, {
    get(t, k, r) { if (typeof k === "string") read.add(k); return Reflect.get(t, k, r); },
    has(t, k) { read.add(k); return Reflect.has(t, k); },
    ownKeys(t) { for (const k of Reflect.ownKeys(t)) read.add(k); return Reflect.ownKeys(t); },
  });
}

let failed = 0;
let checked = 0;
for (const file of files) {
  for (const doc of parseAllDocuments(fs.readFileSync(file, "utf8"))) {
    if (doc.errors.length) {
      console.log(`FAIL ${file}: YAML: ${doc.errors[0].message}`);
      failed++;
      continue;
    }
    const obj = doc.toJS();
    if (obj === null || obj === undefined) continue;
    const name = `${obj.kind}/${obj.metadata?.name} (${file})`;
    const validate = await validatorFor(obj.apiVersion, obj.kind);
    if (!validate) {
      console.log(`FAIL ${name}: no schema for apiVersion ${obj.apiVersion} kind ${obj.kind}`);
      failed++;
      continue;
    }
    const seen = [];
    const problems = [];
    if (!validate(track(obj, "", seen))) {
      for (const e of validate.errors) {
        problems.push(`${e.instancePath || "/"} ${e.keyword}: ${JSON.stringify(e.params)}`);
      }
    }
    for (const { where, keys, read } of seen) {
      for (const k of keys) if (!read.has(k)) problems.push(`${where}/${k}: unknown field`);
    }
    checked++;
    if (problems.length) {
      failed++;
      console.log(`FAIL ${name}:\n  ${problems.join("\n  ")}`);
    } else {
      console.log(`ok   ${name}`);
    }
  }
}
console.log(`${checked} objects checked, ${failed} failed`);
process.exit(failed ? 1 : 0);
