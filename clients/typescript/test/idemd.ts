// The real daemon for the end-to-end tests: idemd built from this repository, run as a
// subprocess on its own PostgreSQL schema; psql for the test's own SQL; and a proxy that
// can lose answers after idemd committed.
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);

/** The test database, as for the Go tests (internal/pgtest). */
export const databaseURL = process.env.TEST_DATABASE_URL || "postgres://postgres@127.0.0.1:5432/test?sslmode=disable";

// clients/typescript/build/idemd.js → the repository root.
const repoRoot = fileURLToPath(new URL("../../../", import.meta.url));

/** Runs one SQL script with psql and returns its unaligned, tuples-only output. */
export async function psql(sql: string): Promise<string> {
  const { stdout } = await run("psql", [databaseURL, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql]);
  return stdout.trim();
}

/**
 * A psql session holding `LOCK TABLE table IN SHARE MODE` in an open transaction: INSERTs
 * into the table wait until release(). Resolves once the lock is held.
 */
export async function lockTable(table: string): Promise<{ release: () => Promise<void> }> {
  const p = spawn("psql", [databaseURL, "-X", "-q", "-v", "ON_ERROR_STOP=1"], { stdio: ["pipe", "pipe", "pipe"] });
  let out = "";
  const exited = new Promise<void>((resolve) => p.once("exit", () => resolve()));
  const said = (word: string) =>
    new Promise<void>((resolve, reject) => {
      const check = () => {
        if (out.includes(word)) {
          p.stdout.off("data", onData);
          resolve();
        }
      };
      const onData = (d: Buffer) => {
        out += d;
        check();
      };
      p.stdout.on("data", onData);
      p.once("exit", () => reject(new Error(`psql exited before it said ${word}: ${out}`)));
      check();
    });
  let err = "";
  p.stderr.on("data", (d: Buffer) => (err += d));
  p.stdin.write(`BEGIN;\nLOCK TABLE ${table} IN SHARE MODE;\n\\echo locked\n`);
  await said("locked").catch((e: Error) => {
    throw new Error(`${e.message}${err}`);
  });
  return {
    release: async () => {
      p.stdin.end("COMMIT;\n");
      await exited;
    },
  };
}

/** A unique schema name for one run. */
export function schemaName(prefix: string): string {
  return `${prefix}_${randomBytes(6).toString("hex")}`;
}

/** A running idemd. */
export interface Idemd {
  /** The receiver's base URL, http://127.0.0.1:port. */
  url: string;
  /** Everything the process wrote so far. */
  output(): string;
  /** SIGTERM, then waits for the exit. */
  stop(): Promise<void>;
}

/**
 * Builds cmd/idemd (or takes IDEMD_BIN), writes the pipelines file and runs `idemd serve`
 * with the receiver role on schema. It resolves when idemd logs "idemd is serving", whose
 * http_addr is the port it picked (IDEMD_HTTP_ADDR=127.0.0.1:0).
 */
export async function startIdemd(schema: string, pipelines: string, env: Record<string, string>): Promise<Idemd> {
  const dir = await mkdtemp(join(tmpdir(), "idemd-ts-"));
  let bin = process.env.IDEMD_BIN;
  if (!bin) {
    bin = join(dir, "idemd");
    await run(process.env.GO || "go", ["build", "-o", bin, "./cmd/idemd"], { cwd: repoRoot });
  }
  const file = join(dir, "idemd.yaml");
  await writeFile(file, pipelines);
  const proc: ChildProcess = spawn(bin, ["serve"], {
    stdio: ["ignore", "pipe", "pipe"],
    env: {
      PATH: process.env.PATH ?? "",
      HOME: process.env.HOME ?? "",
      IDEMD_DATABASE_URL: databaseURL,
      IDEMD_DB_SCHEMA: schema,
      IDEMD_ROLES: "receiver",
      IDEMD_PIPELINES_FILE: file,
      IDEMD_HTTP_ADDR: "127.0.0.1:0",
      IDEMD_ADMIN_ADDR: "127.0.0.1:0",
      IDEMD_LOG_FORMAT: "json",
      IDEMD_SHUTDOWN_TIMEOUT: "10s",
      ...env,
    },
  });
  let output = "";
  const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
  const addr = await new Promise<string>((resolve, reject) => {
    const onData = (d: Buffer) => {
      output += d;
      for (const line of output.split("\n")) {
        if (!line.includes('"idemd is serving"')) continue;
        const { http_addr } = JSON.parse(line) as { http_addr: string };
        resolve(http_addr);
      }
    };
    proc.stdout!.on("data", onData);
    proc.stderr!.on("data", onData);
    exited.then((code) => reject(new Error(`idemd exited (${code}) before it served:\n${output}`)));
  });
  return {
    url: `http://${addr}`,
    output: () => output,
    stop: async () => {
      if (proc.exitCode === null) proc.kill("SIGTERM");
      await exited;
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** What the proxy did with one request. */
export interface Forwarded {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
  /** The answer was lost: the client's connection was cut after idemd answered. */
  lost: boolean;
}

/**
 * An HTTP proxy in front of target. Each request is forwarded whole; when loseAnswer(n)
 * (n from 1) says so, the proxy reads idemd's whole answer — idemd answers only after its
 * transaction committed — and then cuts the client's connection instead of passing it on.
 */
export async function startProxy(
  target: string,
  loseAnswer: (n: number) => boolean,
): Promise<{ url: string; forwarded: Forwarded[]; close: () => Promise<void> }> {
  const forwarded: Forwarded[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const out = http.request(`${target}${req.url}`, { method: req.method, headers: req.headers }, (answer) => {
        const body: Buffer[] = [];
        answer.on("data", (c: Buffer) => body.push(c));
        answer.on("end", () => {
          const f: Forwarded = {
            status: answer.statusCode ?? 0,
            headers: answer.headers,
            body: Buffer.concat(body).toString(),
            lost: loseAnswer(forwarded.length + 1),
          };
          forwarded.push(f);
          if (f.lost) {
            req.socket.destroy();
            return;
          }
          res.writeHead(f.status, answer.headers);
          res.end(f.body);
        });
      });
      out.on("error", (e) => {
        res.writeHead(502);
        res.end(String(e));
      });
      out.end(Buffer.concat(chunks));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    forwarded,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
