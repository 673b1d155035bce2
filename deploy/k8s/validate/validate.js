#!/usr/bin/env node
// Validates rendered Kubernetes manifests offline against the API schemas of kubernetes-models: every object's
// apiVersion and kind must name a model class, and the object must pass that class's validate() (types, enums,
// required fields; fields the schema does not know pass, as they would on the API server's client side).
//
//   kubectl kustomize deploy/k8s/base | node validate.js [--name=LABEL]
//   node validate.js [--name=LABEL] rendered.yaml ...
//
// Prints one line per object and "LABEL: N objects valid"; exits 1 on any invalid object or unknown kind,
// 2 on bad input (unreadable file, YAML that does not parse, no objects at all).
'use strict';

const fs = require('fs');
const path = require('path');
const yaml = require('js-yaml');

// Where kubernetes-models keeps the class of apiVersion/kind: "v1" -> v1/Kind, "apps/v1" -> apps/v1/Kind.
// Only plain names are looked up, so a manifest cannot make this load an arbitrary file.
function modelClass(apiVersion, kind) {
  if (typeof apiVersion !== 'string' || typeof kind !== 'string') return null;
  if (!/^([a-z0-9.-]+\/)?v[0-9]+((alpha|beta)[0-9]+)?$/.test(apiVersion) || !/^[A-Z][A-Za-z0-9]*$/.test(kind)) {
    return null;
  }
  let module;
  try {
    module = require(`kubernetes-models/${apiVersion}/${kind}`);
  } catch (e) {
    if (e.code === 'MODULE_NOT_FOUND' || e.code === 'ERR_PACKAGE_PATH_NOT_EXPORTED') return null;
    throw e;
  }
  const cls = module[kind];
  // The module must be the top-level type itself, not a nested one (e.g. v1/PodSpec has no apiVersion/kind).
  if (typeof cls !== 'function' || cls.apiVersion !== apiVersion || cls.kind !== kind) return null;
  return cls;
}

function describe(object) {
  const name = object && object.metadata && object.metadata.name;
  return `${object && object.apiVersion}/${object && object.kind} ${name || '(no name)'}`;
}

function validate(object) {
  if (object === null || typeof object !== 'object' || Array.isArray(object)) {
    return ['not a mapping'];
  }
  const cls = modelClass(object.apiVersion, object.kind);
  if (!cls) return [`unknown kind: no schema for apiVersion ${object.apiVersion}, kind ${object.kind}`];
  try {
    new cls(object).validate();
  } catch (e) {
    if (Array.isArray(e.errors)) {
      return e.errors.map((error) => `${error.instancePath || '/'} ${error.message}` +
          (error.params && Object.keys(error.params).length ? ` ${JSON.stringify(error.params)}` : ''));
    }
    return [String(e.message || e)];
  }
  return [];
}

function main(argv) {
  let label = 'manifests';
  const files = [];
  for (const arg of argv) {
    if (arg.startsWith('--name=')) {
      label = arg.slice('--name='.length);
    } else if (arg === '-h' || arg === '--help') {
      process.stdout.write('usage: validate.js [--name=LABEL] [FILE.yaml ...]   (stdin without files)\n');
      return 0;
    } else {
      files.push(arg);
    }
  }
  const sources = files.length ? files : ['-'];
  let objects = [];
  for (const source of sources) {
    let text;
    try {
      text = fs.readFileSync(source === '-' ? 0 : source, 'utf8');
    } catch (e) {
      process.stderr.write(`validate.js: cannot read ${source}: ${e.message}\n`);
      return 2;
    }
    try {
      objects = objects.concat(yaml.loadAll(text).filter((doc) => doc !== null && doc !== undefined));
    } catch (e) {
      process.stderr.write(`validate.js: ${source} is not valid YAML: ${e.message}\n`);
      return 2;
    }
  }
  if (objects.length === 0) {
    process.stderr.write(`validate.js: ${label}: no objects in ${sources.join(', ')}\n`);
    return 2;
  }
  let invalid = 0;
  for (const object of objects) {
    const errors = validate(object);
    if (errors.length === 0) {
      process.stdout.write(`  valid    ${describe(object)}\n`);
    } else {
      invalid++;
      process.stdout.write(`  INVALID  ${describe(object)}\n`);
      for (const error of errors) process.stdout.write(`             ${error}\n`);
    }
  }
  if (invalid) {
    process.stdout.write(`${label}: ${invalid} of ${objects.length} objects invalid\n`);
    return 1;
  }
  process.stdout.write(`${label}: ${objects.length} objects valid\n`);
  return 0;
}

if (require.main === module) process.exitCode = main(process.argv.slice(2));

module.exports = { modelClass, validate };
