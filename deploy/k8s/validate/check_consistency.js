#!/usr/bin/env node
// Checks that rendered Tessera manifests agree with the daemons and with themselves: every TESSERA_* variable
// names a flag of the binary the container runs (flag names and types from its --help), ports, probes and
// Services line up, the cluster sizes the scheduler expects are the ones deployed, worker ranks cover
// 0 .. num_workers-1 exactly once, the credential and job files are mounted, and checkpoints are shared.
//
//   node check_consistency.js --name=LABEL --help-scheduler=FILE --help-server=FILE --help-worker=FILE \
//       rendered.yaml
//
// A --help-ROLE file holds the output of `tessera-ROLE --help` (gflags: "    -flag_name (text) type: T ...").
// Prints every mismatch, each naming the object, container and field, then "LABEL: consistent" or
// "LABEL: N mismatches"; exits 1 on any mismatch, 2 on bad input.
'use strict';

const fs = require('fs');
const yaml = require('js-yaml');

const ROLES = ['scheduler', 'server', 'worker'];
const LOOPBACK = new Set(['127.0.0.1', 'localhost', '::1', '[::1]']);
// The keys of the operator-made Secret (see deploy/k8s/README.md); it is not part of the rendered manifests.
const CREDENTIAL_SECRET = 'tessera-credentials';
const CREDENTIAL_KEYS = new Set(['token', 'tls.crt', 'tls.key', 'ca.crt']);
const FILE_FLAGS = ['TESSERA_TOKEN_FILE', 'TESSERA_TLS_CERT', 'TESSERA_TLS_KEY', 'TESSERA_TLS_CA', 'TESSERA_JOB'];

// gflags' --help: a flag starts a line "    -name (description..." and its "type: T" follows, maybe lines later.
function parseHelp(text) {
  const flags = new Map();
  let current = null;
  for (const line of text.split('\n')) {
    const start = /^\s+-([A-Za-z0-9_]+) \(/.exec(line);
    if (start) {
      current = start[1];
      flags.set(current, null);
    }
    const type = current && /\btype: ([a-z0-9_]+)/.exec(line);
    if (type && flags.get(current) === null) flags.set(current, type[1]);
  }
  return flags;
}

function valueMatchesType(value, type) {
  switch (type) {
    case 'int32': case 'int64': return /^-?[0-9]+$/.test(value);
    case 'uint32': case 'uint64': return /^[0-9]+$/.test(value);
    case 'double': return /^-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/.test(value);
    case 'bool': return /^(true|false|yes|no|t|f|y|n|1|0)$/i.test(value);
    default: return true;  // string
  }
}

class Checker {
  constructor(objects, flagsByRole) {
    this.objects = objects;
    this.flagsByRole = flagsByRole;
    this.errors = [];
    this.missingFlags = new Map();  // "tessera-ROLE --flag" -> count, for the summary
  }

  error(where, message) { this.errors.push(`${where}: ${message}`); }

  ofKind(kind) { return this.objects.filter((o) => o.kind === kind); }

  // Every container of every workload, with its role (from command[0] = tessera-ROLE, else the component
  // label) and its environment as a Map.
  collectContainers() {
    const containers = [];
    for (const workload of this.objects) {
      if (!['Deployment', 'StatefulSet', 'Job', 'DaemonSet', 'ReplicaSet', 'Pod'].includes(workload.kind)) continue;
      const template = workload.kind === 'Pod' ? workload : ((workload.spec || {}).template || {});
      const podSpec = template.spec || {};
      const labels = (template.metadata || {}).labels || {};
      for (const container of [].concat(podSpec.initContainers || [], podSpec.containers || [])) {
        const where = `${workload.kind}/${workload.metadata.name} container ${container.name}`;
        const command = (container.command || [])[0] || '';
        const byCommand = /(?:^|\/)tessera-(scheduler|server|worker)$/.exec(command);
        const env = new Map();
        const order = [];
        for (const variable of container.env || []) {
          if (env.has(variable.name)) this.error(where, `env ${variable.name} is set twice`);
          env.set(variable.name, variable);
          order.push(variable.name);
        }
        const hasTessera = order.some((name) => name.startsWith('TESSERA_'));
        let role = byCommand ? byCommand[1] : null;
        if (!role && hasTessera && ROLES.includes(labels['app.kubernetes.io/component'])) {
          role = labels['app.kubernetes.io/component'];
        }
        if (!role) {
          if (hasTessera) this.error(where, 'sets TESSERA_* variables but runs no tessera-scheduler/server/worker');
          continue;
        }
        if (labels['app.kubernetes.io/component'] !== role) {
          this.error(where, `runs tessera-${role} but its pod's label app.kubernetes.io/component is ` +
              `${JSON.stringify(labels['app.kubernetes.io/component'])}`);
        }
        if (labels['app.kubernetes.io/name'] !== 'tessera') {
          this.error(where, 'its pod lacks the label app.kubernetes.io/name=tessera');
        }
        // A worker that runs the user's script (tessera.torch) instead of tessera-worker: it reads the same
        // variables but serves no HTTP, so it has no ports or probes.
        const script = role === 'worker' && !byCommand;
        containers.push({ workload, podSpec, labels, container, role, env, order, where, script });
      }
    }
    return containers;
  }

  value(c, name) {
    const variable = c.env.get(name);
    return variable && typeof variable.value === 'string' ? variable.value : undefined;
  }

  checkEnvironment(c) {
    const flags = this.flagsByRole[c.role];
    c.order.forEach((name, index) => {
      const variable = c.env.get(name);
      // $(VAR) is expanded only from variables defined earlier in the list; otherwise it stays literal text.
      for (const match of String(variable.value || '').matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
        if (!c.order.slice(0, index).includes(match[1])) {
          this.error(c.where, `env ${name} refers to $(${match[1]}), which is not defined before it`);
        }
      }
      if (!name.startsWith('TESSERA_')) return;
      const flag = name.slice('TESSERA_'.length).toLowerCase();
      if (!flags.has(flag)) {
        this.error(c.where, `env ${name} names no flag of tessera-${c.role}: --${flag} is not in ` +
            `\`tessera-${c.role} --help\` (the daemon exits 2 on it)`);
        const key = `tessera-${c.role} --${flag}`;
        this.missingFlags.set(key, (this.missingFlags.get(key) || 0) + 1);
        return;
      }
      const type = flags.get(flag);
      if (typeof variable.value === 'string' && !variable.value.includes('$(') &&
          !valueMatchesType(variable.value, type)) {
        this.error(c.where, `env ${name}=${JSON.stringify(variable.value)} is not a valid ${type} for --${flag}`);
      }
    });
    if (!c.env.has('POD_NAME') || ((c.env.get('POD_NAME').valueFrom || {}).fieldRef || {}).fieldPath !==
        'metadata.name') {
      this.error(c.where, 'POD_NAME must come from the downward API (fieldRef metadata.name)');
    }
    if (!c.env.has('POD_IP') || ((c.env.get('POD_IP').valueFrom || {}).fieldRef || {}).fieldPath !== 'status.podIP') {
      this.error(c.where, 'POD_IP must come from the downward API (fieldRef status.podIP)');
    }
  }

  // Returns {host, tls, grpcPort, httpPort}; checks the listening side: TLS off loopback, fixed ports that the
  // container declares, nothing declared that no flag opens.
  checkListening(c) {
    const host = this.value(c, 'TESSERA_HOST') || '127.0.0.1';
    const tls = Boolean(this.value(c, 'TESSERA_TLS_CERT') && this.value(c, 'TESSERA_TLS_KEY'));
    const insecure = /^(true|yes|t|y|1)$/i.test(this.value(c, 'TESSERA_INSECURE') || '');
    if (!LOOPBACK.has(host) && !tls && !insecure) {
      this.error(c.where, `listens on ${host} without TLS (TESSERA_TLS_CERT and TESSERA_TLS_KEY) or ` +
          'TESSERA_INSECURE=true: the daemon refuses plaintext off loopback');
    }
    if (Boolean(this.value(c, 'TESSERA_TLS_CERT')) !== Boolean(this.value(c, 'TESSERA_TLS_KEY'))) {
      this.error(c.where, 'TESSERA_TLS_CERT and TESSERA_TLS_KEY go together');
    }
    const declared = new Map((c.container.ports || []).map((p) => [p.name, p.containerPort]));
    const used = new Set();
    const fixedPort = (variable, portName, required) => {
      const text = this.value(c, variable);
      if (text === undefined) {
        if (required) this.error(c.where, `${variable} is not set: the port would be random, no Service or probe ` +
            'could reach it');
        return undefined;
      }
      const port = Number(text);
      if (variable === 'TESSERA_HTTP_PORT' && port === -1) return undefined;  // HTTP off
      if (!Number.isInteger(port) || port < 1 || port > 65535) {
        this.error(c.where, `${variable}=${text} is not a fixed port (1-65535)`);
        return undefined;
      }
      if (!declared.has(portName)) {
        this.error(c.where, `${variable}=${port} but the container declares no port named ${portName}`);
      } else if (declared.get(portName) !== port) {
        this.error(c.where, `container port ${portName} is ${declared.get(portName)} but ${variable}=${port}`);
      }
      used.add(portName);
      return port;
    };
    const grpcPort = c.role === 'worker' ? undefined : fixedPort('TESSERA_PORT', 'grpc', true);
    const httpPort = fixedPort('TESSERA_HTTP_PORT', 'http', true);
    for (const [name, port] of declared) {
      if (!used.has(name)) {
        this.error(c.where, `container port ${name || '(unnamed)'} (${port}) matches neither TESSERA_PORT nor ` +
            'TESSERA_HTTP_PORT: nothing listens there');
      }
    }
    return { host, tls, grpcPort, httpPort, declared };
  }

  checkProbes(c, listening) {
    for (const kind of ['readinessProbe', 'livenessProbe', 'startupProbe']) {
      const probe = c.container[kind];
      if (!probe) {
        if (kind !== 'startupProbe') this.error(c.where, `has no ${kind}`);
        continue;
      }
      const where = `${c.where} ${kind}`;
      const handler = probe.httpGet ? 'httpGet' : probe.grpc ? 'grpc' : probe.tcpSocket ? 'tcpSocket' : null;
      if (!handler) {
        this.error(where, 'is neither httpGet, grpc nor tcpSocket');
        continue;
      }
      const port = probe[handler].port;
      let number;
      if (typeof port === 'string' && !/^[0-9]+$/.test(port)) {
        if (!listening.declared.has(port)) {
          this.error(where, `points at port ${port}, which the container does not declare`);
          continue;
        }
        number = listening.declared.get(port);
      } else {
        number = Number(port);
        if (![...listening.declared.values()].includes(number)) {
          this.error(where, `points at port ${number}, which the container does not declare`);
          continue;
        }
      }
      if (LOOPBACK.has(listening.host)) {
        this.error(where, `cannot reach the daemon, which listens on ${listening.host} (set TESSERA_HOST=0.0.0.0)`);
      }
      if (handler === 'httpGet') {
        if (number !== listening.httpPort) {
          this.error(where, `httpGet port ${number} is not the HTTP port (TESSERA_HTTP_PORT=${listening.httpPort})`);
        }
        if (probe.httpGet.path !== '/healthz') this.error(where, `httpGet path ${probe.httpGet.path} is not /healthz`);
        const scheme = probe.httpGet.scheme || 'HTTP';
        if (scheme !== (listening.tls ? 'HTTPS' : 'HTTP')) {
          this.error(where, `scheme ${scheme}, but the daemon serves ${listening.tls ? 'HTTPS (TLS on)' : 'HTTP'}`);
        }
      } else if (handler === 'grpc') {
        if (number !== listening.grpcPort) {
          this.error(where, `grpc port ${number} is not the gRPC port (TESSERA_PORT=${listening.grpcPort})`);
        }
        if (listening.tls) this.error(where, 'kubelet\'s gRPC probe speaks plaintext, but this daemon serves TLS');
      }
    }
  }

  mountFor(c, path) {
    let best = null;
    for (const mount of c.container.volumeMounts || []) {
      const root = mount.mountPath.replace(/\/+$/, '');
      if ((path === root || path.startsWith(`${root}/`)) && (!best || root.length > best.root.length)) {
        best = { mount, root, volume: (c.podSpec.volumes || []).find((v) => v.name === mount.name) };
      }
    }
    return best;
  }

  checkFiles(c) {
    for (const variable of FILE_FLAGS) {
      const path = this.value(c, variable);
      if (!path) continue;
      const found = this.mountFor(c, path);
      if (!found) {
        this.error(c.where, `${variable}=${path} is under no volumeMount`);
        continue;
      }
      if (!found.volume) {
        this.error(c.where, `volumeMount ${found.mount.name} names no volume of the pod`);
        continue;
      }
      const key = found.mount.subPath ? found.mount.subPath : path.slice(found.root.length + 1).split('/')[0];
      if (found.volume.configMap) {
        const map = this.ofKind('ConfigMap').find((m) => m.metadata.name === found.volume.configMap.name);
        if (!map) {
          this.error(c.where, `${variable}: ConfigMap ${found.volume.configMap.name} is not in the manifests`);
        } else if (!(map.data || {})[key]) {
          this.error(c.where, `${variable}=${path}: ConfigMap ${map.metadata.name} has no key ${key}`);
        }
      } else if (found.volume.secret) {
        const name = found.volume.secret.secretName;
        const secret = this.ofKind('Secret').find((s) => s.metadata.name === name);
        const keys = secret ? new Set(Object.keys(Object.assign({}, secret.data, secret.stringData)))
                            : name === CREDENTIAL_SECRET ? CREDENTIAL_KEYS : null;
        if (!keys) {
          this.error(c.where, `${variable}: Secret ${name} is neither in the manifests nor ${CREDENTIAL_SECRET}`);
        } else if (!keys.has(key)) {
          this.error(c.where, `${variable}=${path}: Secret ${name} has no key ${key} (it has ${[...keys].join(', ')})`);
        }
      }
    }
  }

  // The Services that select this pod template's labels.
  servicesSelecting(labels) {
    return this.ofKind('Service').filter((s) => {
      const selector = (s.spec || {}).selector;
      return selector && Object.keys(selector).length &&
          Object.entries(selector).every(([k, v]) => labels[k] === v);
    });
  }

  // A Service port's targetPort as a container port number of the container c, or undefined.
  resolveTarget(servicePort, c) {
    const target = servicePort.targetPort === undefined ? servicePort.port : servicePort.targetPort;
    const ports = c.container.ports || [];
    const hit = typeof target === 'string' && !/^[0-9]+$/.test(target)
        ? ports.find((p) => p.name === target) : ports.find((p) => p.containerPort === Number(target));
    return hit ? hit.containerPort : undefined;
  }

  checkServices(containers) {
    for (const service of this.ofKind('Service')) {
      const where = `Service/${service.metadata.name}`;
      const selected = containers.filter((c) => this.servicesSelecting(c.labels).includes(service));
      if (!selected.length) {
        this.error(where, 'selects no Tessera pod');
        continue;
      }
      const roles = new Set(selected.map((c) => c.role));
      if (roles.size > 1) this.error(where, `selects pods of several roles (${[...roles].join(', ')})`);
      for (const port of service.spec.ports || []) {
        for (const c of selected) {
          if (this.resolveTarget(port, c) === undefined) {
            this.error(where, `port ${port.name || port.port} targets ${port.targetPort}, which ${c.where} ` +
                'does not declare');
          }
        }
      }
    }
  }

  checkScheduler(schedulers) {
    if (schedulers.length !== 1) {
      this.error('manifests', `expected exactly one tessera-scheduler container, found ${schedulers.length}`);
      return;
    }
    const s = schedulers[0];
    const replicas = s.workload.spec.replicas === undefined ? 1 : s.workload.spec.replicas;
    if (s.workload.kind !== 'Deployment' || replicas !== 1) {
      this.error(s.where, `the scheduler must be one pod (a Deployment of 1 replica), is ${s.workload.kind} ` +
          `with ${replicas}`);
    }
  }

  // TESSERA_SCHEDULER of a server or worker: HOST:PORT where HOST is the scheduler's Service and PORT that
  // Service's grpc port, which leads to the scheduler's TESSERA_PORT.
  checkSchedulerAddress(c, scheduler) {
    const address = this.value(c, 'TESSERA_SCHEDULER');
    if (!address) {
      this.error(c.where, 'TESSERA_SCHEDULER is not set (outside Slurm there is no other way to find it)');
      return;
    }
    const match = /^([^:]+):([0-9]+)$/.exec(address);
    if (!match) {
      this.error(c.where, `TESSERA_SCHEDULER=${address} is not HOST:PORT`);
      return;
    }
    const serviceName = match[1].split('.')[0];
    const port = Number(match[2]);
    const service = this.ofKind('Service').find((sv) => sv.metadata.name === serviceName);
    if (!service) {
      this.error(c.where, `TESSERA_SCHEDULER=${address}: no Service ${serviceName} in the manifests`);
      return;
    }
    if (!scheduler || !this.servicesSelecting(scheduler.labels).includes(service)) {
      this.error(c.where, `TESSERA_SCHEDULER=${address}: Service ${serviceName} does not select the scheduler pod`);
      return;
    }
    const servicePort = (service.spec.ports || []).find((p) => p.port === port);
    const grpcPort = (service.spec.ports || []).find((p) => p.name === 'grpc');
    if (!grpcPort) {
      this.error(`Service/${serviceName}`, 'has no port named grpc');
    } else if (port !== grpcPort.port) {
      this.error(c.where, `TESSERA_SCHEDULER=${address}: port ${port} is not Service ${serviceName}'s grpc port ` +
          `${grpcPort.port}`);
    }
    if (servicePort) {
      const target = this.resolveTarget(servicePort, scheduler);
      const schedulerPort = Number(this.value(scheduler, 'TESSERA_PORT'));
      if (target !== schedulerPort) {
        this.error(c.where, `TESSERA_SCHEDULER=${address} reaches scheduler container port ${target}, but the ` +
            `scheduler listens on TESSERA_PORT=${schedulerPort}`);
      }
    }
  }

  checkServers(servers, scheduler) {
    const expected = scheduler && Number(this.value(scheduler, 'TESSERA_NUM_SERVERS'));
    if (scheduler && !(expected > 0)) {
      this.error(scheduler.where, 'TESSERA_NUM_SERVERS must be set (> 0) beside the server replicas');
    }
    let total = 0;
    for (const c of servers) {
      if (c.workload.kind !== 'StatefulSet') {
        this.error(c.where, `servers take their id from a StatefulSet ordinal, not a ${c.workload.kind}`);
        continue;
      }
      const replicas = c.workload.spec.replicas === undefined ? 1 : c.workload.spec.replicas;
      total += replicas;
      const serviceName = c.workload.spec.serviceName;
      const service = this.ofKind('Service').find((s) => s.metadata.name === serviceName);
      if (!service) {
        this.error(c.where, `serviceName ${serviceName} names no Service in the manifests`);
      } else {
        if (service.spec.clusterIP !== 'None') this.error(`Service/${serviceName}`, 'must be headless (clusterIP: None)');
        if (!this.servicesSelecting(c.labels).includes(service)) {
          this.error(`Service/${serviceName}`, `does not select the pods of ${c.where}`);
        }
      }
      const advertise = this.value(c, 'TESSERA_ADVERTISE_HOST');
      if (advertise === undefined) {
        if (this.value(c, 'TESSERA_TLS_CA')) {
          this.error(c.where, 'TESSERA_ADVERTISE_HOST is not set: workers would dial the pod IP, which no ' +
              'certificate names');
        }
      } else if (!new RegExp(`^\\$\\(POD_NAME\\)\\.${serviceName}(\\.|$)`).test(advertise)) {
        this.error(c.where, `TESSERA_ADVERTISE_HOST=${advertise} is not $(POD_NAME).${serviceName}[...]: the ` +
            'pod\'s own DNS name under the headless Service');
      }
      if (this.value(c, 'TESSERA_ID') !== undefined) {
        this.error(c.where, 'TESSERA_ID is set: every replica would claim the same id (the ordinal gives it)');
      }
    }
    if (scheduler && expected > 0 && total !== expected) {
      this.error(scheduler.where, `TESSERA_NUM_SERVERS=${expected} but the server StatefulSets have ${total} ` +
          'replicas');
    }
  }

  checkWorkers(workers, scheduler) {
    const expected = scheduler && Number(this.value(scheduler, 'TESSERA_NUM_WORKERS'));
    if (scheduler && !(expected > 0)) {
      this.error(scheduler.where, 'TESSERA_NUM_WORKERS must be set (> 0) beside the worker Jobs');
    }
    const ranges = [];
    let total = 0;
    for (const c of workers) {
      const spec = c.workload.spec;
      if (c.workload.kind !== 'Job' || spec.completionMode !== 'Indexed') {
        this.error(c.where, 'workers take their rank from JOB_COMPLETION_INDEX: run them as an Indexed Job');
        continue;
      }
      const completions = spec.completions === undefined ? 1 : spec.completions;
      const parallelism = spec.parallelism === undefined ? 1 : spec.parallelism;
      if (parallelism !== completions) {
        this.error(c.where, `parallelism ${parallelism} != completions ${completions}: every rank must run at ` +
            'once (a sync round waits for all of them)');
      }
      if (this.value(c, 'TESSERA_RANK') !== undefined) {
        this.error(c.where, 'TESSERA_RANK is set: every pod would claim the same rank (the index gives it)');
      }
      const offset = Number(this.value(c, 'TESSERA_RANK_OFFSET') || 0);
      total += parallelism;
      ranges.push({ where: c.where, from: offset, to: offset + completions - 1, parallelism });
    }
    if (scheduler && expected > 0) {
      if (total !== expected) {
        this.error(scheduler.where, `TESSERA_NUM_WORKERS=${expected} but the worker Jobs run ${total} workers ` +
            `(parallelism ${ranges.map((r) => r.parallelism).join(' + ') || 0})`);
      }
      const owner = new Array(expected).fill(null);
      for (const r of ranges) {
        for (let rank = r.from; rank <= r.to; rank++) {
          if (rank < 0 || rank >= expected) {
            this.error(r.where, `rank ${rank} is outside 0..${expected - 1} (TESSERA_NUM_WORKERS=${expected})`);
          } else if (owner[rank]) {
            this.error(r.where, `rank ${rank} is also taken by ${owner[rank]}`);
          } else {
            owner[rank] = r.where;
          }
        }
      }
      owner.forEach((o, rank) => { if (!o) this.error('workers', `no worker Job runs rank ${rank}`); });
    }
  }

  // The scheduler's checkpoint folder must be one volume that every server mounts too.
  checkCheckpoints(scheduler, servers) {
    const dir = scheduler && this.value(scheduler, 'TESSERA_CHECKPOINT_DIR');
    if (!dir) return;
    const source = (c) => {
      const found = this.mountFor(c, dir);
      if (!found || !found.volume) {
        const template = c.workload.kind === 'StatefulSet' && found &&
            (c.workload.spec.volumeClaimTemplates || []).some((t) => t.metadata.name === found.mount.name);
        this.error(c.where, template
            ? `TESSERA_CHECKPOINT_DIR=${dir} is on a volumeClaimTemplate: each server would have its own volume`
            : `does not mount the scheduler's TESSERA_CHECKPOINT_DIR=${dir}`);
        return null;
      }
      if (!found.volume.persistentVolumeClaim) {
        this.error(c.where, `TESSERA_CHECKPOINT_DIR=${dir} is on volume ${found.volume.name}, which is not a ` +
            'shared PersistentVolumeClaim');
        return null;
      }
      return found.volume.persistentVolumeClaim.claimName;
    };
    const claims = new Set([scheduler, ...servers].map(source).filter(Boolean));
    if (claims.size > 1) {
      this.error('checkpoints', `the scheduler and the servers mount different claims at ${dir}: ${[...claims]}`);
    }
    for (const claimName of claims) {
      const claim = this.ofKind('PersistentVolumeClaim').find((p) => p.metadata.name === claimName);
      if (claim && !(claim.spec.accessModes || []).includes('ReadWriteMany')) {
        this.error(`PersistentVolumeClaim/${claimName}`, 'is not ReadWriteMany, but the scheduler and every server ' +
            'write to it');
      }
    }
  }

  // Kubelet adds NAME_SERVICE_HOST, NAME_PORT, ... for each Service unless enableServiceLinks is false; for a
  // Service named tessera-* these are TESSERA_* variables, which the daemons reject as unknown flags.
  checkServiceLinks(containers) {
    const injected = this.ofKind('Service')
        .map((s) => `${s.metadata.name.toUpperCase().replace(/-/g, '_')}_SERVICE_HOST`)
        .filter((name) => name.startsWith('TESSERA_'));
    if (!injected.length) return;
    const seen = new Set();
    for (const c of containers) {
      if (seen.has(c.podSpec)) continue;
      seen.add(c.podSpec);
      if (c.podSpec.enableServiceLinks !== false) {
        this.error(`${c.workload.kind}/${c.workload.metadata.name}`, `enableServiceLinks is not false: kubelet ` +
            `would set ${injected.join(', ')} and more, which tessera-${c.role} refuses as unknown flags`);
      }
    }
  }

  checkNonRoot(containers) {
    for (const c of containers) {
      const pod = c.podSpec.securityContext || {};
      const own = c.container.securityContext || {};
      const nonRoot = own.runAsNonRoot !== undefined ? own.runAsNonRoot : pod.runAsNonRoot;
      if (nonRoot !== true) this.error(c.where, 'does not set runAsNonRoot: true');
    }
  }

  run() {
    for (const object of this.objects) {
      const labels = (object.metadata || {}).labels || {};
      if (labels['app.kubernetes.io/name'] !== 'tessera') {
        this.error(`${object.kind}/${(object.metadata || {}).name}`, 'lacks the label app.kubernetes.io/name=tessera');
      }
    }
    const containers = this.collectContainers();
    for (const c of containers) {
      this.checkEnvironment(c);
      if (c.script) {
        for (const name of ['TESSERA_HOST', 'TESSERA_HTTP_PORT']) {
          if (c.env.has(name)) this.error(c.where, `${name} is set but a worker script serves no HTTP`);
        }
      } else {
        this.checkProbes(c, this.checkListening(c));
      }
      this.checkFiles(c);
    }
    const schedulers = containers.filter((c) => c.role === 'scheduler');
    const servers = containers.filter((c) => c.role === 'server');
    const workers = containers.filter((c) => c.role === 'worker');
    this.checkScheduler(schedulers);
    const scheduler = schedulers.length === 1 ? schedulers[0] : null;
    if (scheduler && !this.value(scheduler, 'TESSERA_JOB')) this.error(scheduler.where, 'TESSERA_JOB is not set');
    if (!servers.length) this.error('manifests', 'no tessera-server container');
    if (!workers.length) this.error('manifests', 'no tessera-worker container');
    for (const c of servers.concat(workers)) this.checkSchedulerAddress(c, scheduler);
    this.checkServices(containers);
    this.checkServers(servers, scheduler);
    this.checkWorkers(workers, scheduler);
    this.checkCheckpoints(scheduler, servers);
    this.checkServiceLinks(containers);
    this.checkNonRoot(containers);
    return containers.length;
  }
}

function main(argv) {
  let label = 'manifests';
  const helpFiles = {};
  const files = [];
  for (const arg of argv) {
    const help = /^--help-(scheduler|server|worker)=(.+)$/.exec(arg);
    if (help) {
      helpFiles[help[1]] = help[2];
    } else if (arg.startsWith('--name=')) {
      label = arg.slice('--name='.length);
    } else if (arg.startsWith('--')) {
      process.stderr.write(`check_consistency.js: unknown option ${arg}\n`);
      return 2;
    } else {
      files.push(arg);
    }
  }
  const flagsByRole = {};
  for (const role of ROLES) {
    if (!helpFiles[role]) {
      process.stderr.write(`check_consistency.js: --help-${role}=FILE is required\n`);
      return 2;
    }
    try {
      flagsByRole[role] = parseHelp(fs.readFileSync(helpFiles[role], 'utf8'));
    } catch (e) {
      process.stderr.write(`check_consistency.js: cannot read ${helpFiles[role]}: ${e.message}\n`);
      return 2;
    }
    if (flagsByRole[role].size === 0) {
      process.stderr.write(`check_consistency.js: no flags in ${helpFiles[role]} (not tessera-${role} --help?)\n`);
      return 2;
    }
  }
  let objects;
  try {
    const text = fs.readFileSync(files.length ? files[0] : 0, 'utf8');
    objects = yaml.loadAll(text).filter((o) => o && typeof o === 'object');
  } catch (e) {
    process.stderr.write(`check_consistency.js: cannot load the manifests: ${e.message}\n`);
    return 2;
  }
  const checker = new Checker(objects, flagsByRole);
  const count = checker.run();
  for (const error of checker.errors) process.stdout.write(`  MISMATCH ${error}\n`);
  if (checker.missingFlags.size) {
    process.stdout.write(`${label}: flags the manifests use that the binaries lack: ` +
        `${[...checker.missingFlags.keys()].join(', ')}\n`);
  }
  if (checker.errors.length) {
    process.stdout.write(`${label}: ${checker.errors.length} mismatches between the manifests and the daemons\n`);
    return 1;
  }
  process.stdout.write(`${label}: ${count} Tessera containers consistent with the daemons and each other\n`);
  return 0;
}

if (require.main === module) process.exitCode = main(process.argv.slice(2));

module.exports = { parseHelp, Checker };
