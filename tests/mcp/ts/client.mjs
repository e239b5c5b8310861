// The TypeScript MCP SDK's client against `capwire mcp`: over stdio
// (`node client.mjs stdio CAPWIRE STATE`) or streamable HTTP (`node
// client.mjs http URL`). It lists the tools, calls a request, a stream and
// a task with progress, and a hidden controller verb, and prints what it
// saw as one JSON line.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [mode, target, state] = process.argv.slice(2);
const transport =
  mode === "http"
    ? new StreamableHTTPClientTransport(new URL(target))
    : new StdioClientTransport({ command: target, args: ["mcp", "--state", state], stderr: "ignore" });
const client = new Client({ name: "capwire-ts-test", version: "0" });
await client.connect(transport);

const seen = { protocol: client.getServerVersion()?.name };
seen.tools = (await client.listTools()).tools.map((t) => t.name).sort();
seen.echo = (await client.callTool({ name: "alpha__agent__echo", arguments: { value: "ts" } })).structuredContent;

const items = [];
const told = await client.callTool(
  { name: "alpha__agent__tell", arguments: { value: "one two three" } },
  undefined,
  { onprogress: (p) => items.push(JSON.parse(p.message)) },
);
seen.tell = told.structuredContent;
seen.tellProgress = items;

const events = [];
const worked = await client.callTool(
  { name: "alpha__agent__work", arguments: { text: "ts", steps: 2, step_ms: 10 } },
  undefined,
  { onprogress: (p) => events.push(p.message) },
);
seen.work = worked.structuredContent;
seen.workProgress = events;

try {
  await client.callTool({ name: "alpha__agent__probe", arguments: {} });
  seen.hidden = "called";
} catch (e) {
  seen.hidden = String(e.message);
}
await client.close();
console.log(JSON.stringify(seen));
