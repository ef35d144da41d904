// Scenarios for tests/test_serve_js.py: the unmodified npm `e2b` and `@e2b/code-interpreter` packages
// against a real `jailbox serve`, pointed at it by environment variables alone (E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY; JB_OTHER_KEY is a second key of the same server).
//
//   NODE_PATH=<dir>/node_modules node js_sdk.cjs SCENARIO...
//
// Each scenario runs in turn and prints "ok SCENARIO"; the first failure prints its stack and exits 1.
// Every wait is bounded by a deadline.
'use strict'

const assert = require('node:assert/strict')
const http = require('node:http')
const e2b = require('e2b')

const { Sandbox, FileType, FilesystemEventType, CommandExitError, getSignature } = e2b
const OTHER_KEY = process.env.JB_OTHER_KEY
const SERVER = new URL(process.env.E2B_API_URL)

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function until(what, check, ms = 30000, seen = () => '') {
  const deadline = Date.now() + ms
  for (;;) {
    const got = await check()
    if (got) return got
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${seen() ? `; seen: ${seen()}` : ''}`)
    await sleep(50)
  }
}

async function rejects(promise, type, pattern) {
  try {
    await promise
  } catch (err) {
    assert.ok(err instanceof type, `${err && err.constructor.name}: ${err && err.message} is not a ${type.name}`)
    if (pattern) assert.match(err.message, pattern)
    assert.doesNotMatch(String(err.message), /Traceback|Internal Server Error/)
    return err
  }
  throw new Error(`expected a ${type.name}, got none`)
}

// A request to the server's own address with `host` as the Host header: Node's resolver does not know
// *.localhost everywhere, the server needs only the header.
function viaHost(host, path = '/', headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { hostname: SERVER.hostname, port: SERVER.port, path, headers: { host, ...headers }, timeout: 30000 },
      (res) => {
        const chunks = []
        res.on('data', (c) => chunks.push(c))
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }))
      }
    )
    req.on('timeout', () => req.destroy(new Error('timed out')))
    req.on('error', reject)
    req.end()
  })
}

const scenarios = {
  // create, getInfo, list with filters, connect, setTimeout, getMetrics, keys, kill
  async sandboxes() {
    const sb = await Sandbox.create('host', { metadata: { suite: 'js', run: 'one' }, envs: { GREETING: 'hello' } })
    const other = await Sandbox.create('host', { metadata: { suite: 'js', run: 'two' } })
    try {
      assert.ok(await sb.isRunning())
      assert.equal((await sb.commands.run('echo $GREETING')).stdout, 'hello\n')

      const info = await sb.getInfo()
      const full = await Sandbox.getFullInfo(sb.sandboxId)
      assert.deepEqual([full.sandboxId, full.templateId, full.metadata], [sb.sandboxId, 'host', info.metadata])
      assert.equal(info.sandboxId, sb.sandboxId)
      assert.equal(info.templateId, 'host')
      assert.deepEqual(info.metadata, { suite: 'js', run: 'one' })
      assert.equal(info.state, 'running')
      assert.ok(info.endAt > info.startedAt, info)

      const listed = async (query) => (await Sandbox.list({ query }).nextItems()).map((s) => s.sandboxId)
      const all = await listed(undefined)
      assert.ok(all.includes(sb.sandboxId) && all.includes(other.sandboxId), all)
      assert.equal(all.indexOf(other.sandboxId) < all.indexOf(sb.sandboxId), true, 'newest first')
      assert.deepEqual(await listed({ metadata: { run: 'one' } }), [sb.sandboxId])
      assert.deepEqual(await listed({ metadata: { suite: 'js', run: 'two' } }), [other.sandboxId])
      assert.deepEqual(await listed({ metadata: { run: 'none' } }), [])
      assert.deepEqual(await listed({ state: ['paused'], metadata: { suite: 'js' } }), [])
      const pager = Sandbox.list({ query: { metadata: { suite: 'js' } }, limit: 1 })
      const pages = [await pager.nextItems()]
      assert.equal(pager.hasNext, true)
      pages.push(await pager.nextItems())
      assert.deepEqual(pages.map((page) => page.map((s) => s.sandboxId)), [[other.sandboxId], [sb.sandboxId]])
      assert.equal(pager.hasNext, false)
      assert.ok(!(await listed({ startedAfter: new Date(Date.now() + 60_000) })).includes(other.sandboxId))
      assert.ok((await listed({ startedAfter: new Date(Date.now() - 600_000), template: 'host' })).includes(sb.sandboxId))
      assert.ok(!(await listed({ template: 'default' })).includes(sb.sandboxId))
      const listedInfo = (await Sandbox.list({ query: { metadata: { run: 'one' } } }).nextItems())[0]
      assert.deepEqual(listedInfo.metadata, { suite: 'js', run: 'one' })
      assert.equal(listedInfo.state, 'running')

      // another handle on the same sandbox, by id
      const again = await Sandbox.connect(sb.sandboxId)
      assert.equal((await again.commands.run('echo $GREETING')).stdout, 'hello\n')

      // setTimeout moves the end
      await sb.setTimeout(600_000)
      const later = await sb.getInfo()
      const left = later.endAt.getTime() - Date.now()
      assert.ok(left > 500_000 && left <= 600_000, `${left} ms left`)

      // metrics: one sample, now
      const [m] = await sb.getMetrics()
      assert.equal(m.memTotal, info.memoryMB * 1024 * 1024)
      assert.ok(m.cpuCount >= 1 && m.diskTotal > 0 && m.memUsed > 0, m)
      assert.ok(Math.abs(m.timestamp.getTime() - Date.now()) < 30_000, m)
      assert.equal((await Sandbox.getMetrics(sb.sandboxId)).length, 1)
      assert.deepEqual(await sb.getMetrics({ end: new Date(Date.now() - 3600_000) }), [])

      // another key sees none of it; a wrong key is refused
      await rejects(Sandbox.getInfo(sb.sandboxId, { apiKey: OTHER_KEY }), e2b.SandboxNotFoundError)
      await rejects(Sandbox.connect(sb.sandboxId, { apiKey: OTHER_KEY }), e2b.SandboxNotFoundError)
      assert.equal(await Sandbox.kill(sb.sandboxId, { apiKey: OTHER_KEY }), false)
      assert.ok(!(await Sandbox.list({ apiKey: OTHER_KEY }).nextItems()).some((s) => s.sandboxId === sb.sandboxId))
      await rejects(Sandbox.list({ apiKey: 'jbx_' + 'c'.repeat(40) }).nextItems(), e2b.AuthenticationError)
      await rejects(Sandbox.create('no-such-template'), e2b.SandboxError, /no-such-template/)

      // a kill breaks a running command's stream: the SDK's own error, not an exit code
      const running = await sb.commands.run('sleep 300', { background: true })
      await sb.kill()
      await rejects(running.wait(), e2b.SandboxError)
      assert.equal(await sb.isRunning(), false)
      assert.ok(!(await listed(undefined)).includes(sb.sandboxId))
      assert.equal(await Sandbox.kill(sb.sandboxId), false)
      await rejects(sb.commands.run('true'), e2b.SandboxError)
    } finally {
      await Promise.allSettled([sb.kill(), other.kill()])
    }
  },

  // sandboxes made at once, each running a command, over the SDK's shared connections
  async burst() {
    const made = await Promise.allSettled(Array.from({ length: 16 }, () => Sandbox.create('host', { metadata: { suite: 'js-burst' } })))
    const sandboxes = made.filter((r) => r.status === 'fulfilled').map((r) => r.value)
    try {
      assert.deepEqual(made.filter((r) => r.status === 'rejected').map((r) => String(r.reason)), [])
      const outs = await Promise.all(sandboxes.map((sb, i) => sb.commands.run(`echo ${i}`)))
      assert.deepEqual(outs.map((r) => r.stdout), sandboxes.map((_, i) => `${i}\n`))
    } finally {
      await Promise.allSettled(sandboxes.map((sb) => sb.kill()))
    }
  },

  // pause and resume, fork, snapshots
  async branching() {
    const sb = await Sandbox.create('host', { metadata: { suite: 'js-branch' } })
    const made = []
    try {
      await sb.files.write('/kept.txt', 'before the pause')
      const sleeper = await sb.commands.run('sleep 300', { background: true })
      assert.equal(await sb.pause(), true)
      assert.equal(await sb.isRunning(), false)
      assert.equal((await sb.getInfo()).state, 'paused')
      const paused = await Sandbox.list({ query: { state: ['paused'], metadata: { suite: 'js-branch' } } }).nextItems()
      assert.deepEqual(paused.map((s) => s.sandboxId), [sb.sandboxId])
      await sb.connect()
      assert.ok(await sb.isRunning())
      assert.ok((await sb.commands.list()).some((p) => p.pid === sleeper.pid), 'the paused process lives on')
      assert.equal(await sb.files.read('/kept.txt'), 'before the pause')

      // the class forms, by id; betaPause without memory ends the processes, as a filesystem-mode pause
      assert.equal(await Sandbox.betaPause(sb.sandboxId, { keepMemory: false }), true)
      const resumed = await Sandbox.connect(sb.sandboxId)
      assert.ok(!(await resumed.commands.list()).some((p) => p.pid === sleeper.pid), 'a filesystem-mode pause ends them')
      assert.equal(await resumed.files.read('/kept.txt'), 'before the pause')

      const [child] = await sb.fork({ count: 1 })
      made.push(child)
      assert.notEqual(child.sandboxId, sb.sandboxId)
      assert.equal(await child.files.read('/kept.txt'), 'before the pause')
      assert.deepEqual((await child.getInfo()).metadata, { suite: 'js-branch' })

      // paused at its timeout instead of killed, and resumed by the next daemon call
      const napper = await Sandbox.create('host', { lifecycle: { onTimeout: 'pause', autoResume: true } })
      made.push(napper)
      assert.deepEqual((await napper.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: true })
      await napper.files.write('/napped.txt', 'asleep')
      await napper.setTimeout(0)
      await until('the pause at the timeout', async () => (await napper.getInfo()).state === 'paused')
      assert.equal(await napper.files.read('/napped.txt'), 'asleep')
      assert.equal((await napper.getInfo()).state, 'running')

      const snap = await sb.createSnapshot({ name: 'js-snap' })
      assert.match(snap.snapshotId, /^snap-[0-9a-f]{12}$/)
      const listed = await Sandbox.listSnapshots({ sandboxId: sb.sandboxId }).nextItems()
      assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId), listed)
      const fromSnap = await Sandbox.create(snap.snapshotId)
      made.push(fromSnap)
      assert.equal(await fromSnap.files.read('/kept.txt'), 'before the pause')
      await fromSnap.kill()
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
    } finally {
      await Promise.allSettled([sb.kill(), ...made.map((s) => s.kill())])
    }
  },

  // run with output, callbacks, errors, cwd, user, envs; background, stdin, list, kill, connect
  async commands() {
    const sb = await Sandbox.create('host', { envs: { FROM_CREATE: 'made' } })
    try {
      const r = await sb.commands.run('echo out; echo err >&2; echo $FROM_CREATE $ASKED', { envs: { ASKED: 'asked' } })
      assert.deepEqual([r.exitCode, r.stdout, r.stderr], [0, 'out\nmade asked\n', 'err\n'])

      const seen = []
      const streamed = await sb.commands.run('for i in 1 2 3; do echo line$i; sleep 0.05; done', {
        onStdout: (d) => seen.push(d),
      })
      assert.equal(seen.join(''), 'line1\nline2\nline3\n')
      assert.equal(streamed.stdout, seen.join(''))
      const errs = []
      await sb.commands.run('echo e1 >&2', { onStderr: (d) => errs.push(d) })
      assert.equal(errs.join(''), 'e1\n')

      const failed = await rejects(sb.commands.run('echo nope >&2; exit 7'), CommandExitError)
      assert.deepEqual([failed.exitCode, failed.stderr], [7, 'nope\n'])

      assert.equal((await sb.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
      assert.equal((await sb.commands.run('id -u', { user: 'root' })).stdout, '0\n')
      await rejects(sb.commands.run('true', { user: 'nosuchuser' }), e2b.AuthenticationError, /invalid username 'nosuchuser'/)

      const cat = await sb.commands.run('cat; echo done', { background: true, stdin: true })
      await sb.commands.sendStdin(cat.pid, 'fed\n')
      await sb.commands.closeStdin(cat.pid)
      assert.equal((await cat.wait()).stdout, 'fed\ndone\n')

      const ticker = await sb.commands.run('echo started; sleep 300', { background: true })
      await until('the first line', () => ticker.stdout.includes('started'))
      const listed = await sb.commands.list()
      const mine = listed.find((p) => p.pid === ticker.pid)
      assert.ok(mine, JSON.stringify(listed))
      assert.ok(mine.args.join(' ').includes('sleep 300'), mine)
      const attached = []
      const joined = await sb.commands.connect(ticker.pid, { onStdout: (d) => attached.push(d) })
      assert.equal(joined.pid, ticker.pid)
      assert.equal(await sb.commands.kill(ticker.pid), true)
      await rejects(ticker.wait(), CommandExitError)
      await rejects(joined.wait(), CommandExitError)
      assert.ok(!(await sb.commands.list()).some((p) => p.pid === ticker.pid))
      assert.equal(await sb.commands.kill(ticker.pid), false)

      const slow = sb.commands.run('sleep 30', { timeoutMs: 300 })
      await rejects(slow, e2b.TimeoutError)

      const away = await sb.commands.run('sleep 0.5; echo later', { background: true })
      await away.disconnect()
      const back = await sb.commands.connect(away.pid)
      assert.equal((await back.wait()).stdout, 'later\n')

      // git: the SDK's commands in the sandbox (the host tree has git)
      await sb.git.init('/tmp/repo', { initialBranch: 'main' })
      await sb.files.write('/tmp/repo/a.txt', 'tracked')
      assert.deepEqual((await sb.git.status('/tmp/repo')).fileStatus.map((f) => f.name), ['a.txt'])
      await sb.git.add('/tmp/repo', { all: true })
      await sb.git.commit('/tmp/repo', 'first', { authorName: 'js', authorEmail: 'js@example.com' })
      const clean = await sb.git.status('/tmp/repo')
      assert.deepEqual([clean.isClean, clean.currentBranch], [true, 'main'])

      const killed = await sb.commands.run('sleep 300', { background: true })
      await killed.kill()
      const end = await rejects(killed.wait(), CommandExitError)
      assert.notEqual(end.exitCode, 0)
    } finally {
      await sb.kill()
    }
  },

  // a terminal: type into it, resize it, kill it
  async pty() {
    const sb = await Sandbox.create('host')
    try {
      const chunks = []
      const text = () => Buffer.concat(chunks).toString()
      const term = await sb.pty.create({
        cols: 80,
        rows: 24,
        cwd: '/tmp',
        envs: { PTY_VAR: 'in-pty' },
        onData: (d) => chunks.push(Buffer.from(d)),
      })
      const enc = new TextEncoder()
      await sb.pty.sendInput(term.pid, enc.encode('stty size; pwd; echo $PTY_VAR; echo mark$((40+2))\n'))
      await until('mark42', () => text().includes('mark42'))
      assert.match(text(), /24 80/)
      assert.match(text(), /\/tmp/)
      assert.match(text(), /in-pty/)
      const joined = []
      const second = await sb.pty.connect(term.pid, { onData: (d) => joined.push(Buffer.from(d)) })
      assert.equal(second.pid, term.pid)
      await sb.pty.resize(term.pid, { cols: 100, rows: 30 })
      await sb.pty.sendInput(term.pid, enc.encode('stty size; echo mark$((50+5))\n'))
      await until('mark55', () => text().includes('mark55'))
      assert.match(text(), /30 100/)
      await until('mark55 on the connected handle', () => Buffer.concat(joined).toString().includes('mark55'))
      assert.equal(await sb.pty.kill(term.pid), true)
      const end = await term.wait().then(
        (r) => r,
        (err) => err
      )
      assert.ok(end instanceof CommandExitError || end.exitCode !== undefined, String(end))
      assert.ok(!(await sb.commands.list()).some((p) => p.pid === term.pid))
    } finally {
      await sb.kill()
    }
  },

  // files: text and bytes, list, exists, getInfo, makeDir, rename, remove, writeFiles; watchDir
  async files() {
    const sb = await Sandbox.create('host')
    try {
      const info = await sb.files.write('/tmp/js/a.txt', 'hello files')
      assert.equal(info.path, '/tmp/js/a.txt')
      assert.equal(info.type, FileType.FILE)
      assert.equal(await sb.files.read('/tmp/js/a.txt'), 'hello files')

      const bytes = new Uint8Array(256).map((_, i) => i)
      await sb.files.write('/tmp/js/b.bin', bytes.buffer)
      const back = await sb.files.read('/tmp/js/b.bin', { format: 'bytes' })
      assert.ok(back instanceof Uint8Array)
      assert.deepEqual(Buffer.from(back), Buffer.from(bytes))
      const blob = await sb.files.read('/tmp/js/b.bin', { format: 'blob' })
      assert.equal(blob.size, 256)
      assert.equal((await sb.commands.run('od -An -tu1 -N3 -j254 /tmp/js/b.bin')).stdout.trim(), '254 255')

      // the other upload forms: a raw body, gzip-compressed, streamed (chunked), with metadata
      await sb.files.write('/tmp/js/raw.txt', 'raw body', { useOctetStream: true, metadata: { Owner: 'js' } })
      assert.equal(await sb.files.read('/tmp/js/raw.txt'), 'raw body')
      assert.deepEqual((await sb.files.getInfo('/tmp/js/raw.txt')).metadata, { owner: 'js' })
      const big = 'z'.repeat(3 << 20)
      await sb.files.write('/tmp/js/gz.txt', big, { gzip: true })
      assert.equal((await sb.files.getInfo('/tmp/js/gz.txt')).size, big.length)
      assert.equal(await sb.files.read('/tmp/js/gz.txt', { gzip: true }), big)
      const parts = ['first,', 'second,', 'third']
      const stream = new ReadableStream({
        pull(controller) {
          const next = parts.shift()
          if (next === undefined) controller.close()
          else controller.enqueue(new TextEncoder().encode(next))
        },
      })
      await sb.files.write('/tmp/js/streamed.txt', stream)
      assert.equal(await sb.files.read('/tmp/js/streamed.txt'), 'first,second,third')
      const readBack = []
      for await (const chunk of await sb.files.read('/tmp/js/gz.txt', { format: 'stream' })) readBack.push(Buffer.from(chunk))
      assert.equal(Buffer.concat(readBack).length, big.length)
      await sb.files.remove('/tmp/js/raw.txt')
      await sb.files.remove('/tmp/js/gz.txt')
      await sb.files.remove('/tmp/js/streamed.txt')

      await sb.files.writeFiles([
        { path: '/tmp/js/many/1.txt', data: 'one' },
        { path: '/tmp/js/many/2.txt', data: 'two' },
      ])
      assert.equal(await sb.files.read('/tmp/js/many/2.txt'), 'two')

      assert.equal(await sb.files.makeDir('/tmp/js/dir'), true)
      assert.equal(await sb.files.makeDir('/tmp/js/dir'), false)
      const entries = await sb.files.list('/tmp/js')
      assert.deepEqual(
        entries.map((e) => [e.name, e.type]),
        [
          ['a.txt', FileType.FILE],
          ['b.bin', FileType.FILE],
          ['dir', FileType.DIR],
          ['many', FileType.DIR],
        ]
      )
      const deep = await sb.files.list('/tmp/js', { depth: 2 })
      assert.ok(deep.some((e) => e.path === '/tmp/js/many/1.txt'), deep.map((e) => e.path))

      const stat = await sb.files.getInfo('/tmp/js/b.bin')
      assert.equal(stat.size, 256)
      assert.equal(stat.type, FileType.FILE)
      assert.equal(stat.owner, 'root')
      assert.match(stat.permissions, /^-rw/)
      assert.ok(stat.modifiedTime instanceof Date, stat)
      assert.equal(await sb.files.exists('/tmp/js/a.txt'), true)
      assert.equal(await sb.files.exists('/tmp/js/nope'), false)

      const moved = await sb.files.rename('/tmp/js/a.txt', '/tmp/js/dir/c.txt')
      assert.equal(moved.path, '/tmp/js/dir/c.txt')
      assert.equal(await sb.files.read('/tmp/js/dir/c.txt'), 'hello files')
      assert.equal(await sb.files.exists('/tmp/js/a.txt'), false)
      await sb.files.remove('/tmp/js/dir')
      assert.equal(await sb.files.exists('/tmp/js/dir/c.txt'), false)
      await sb.files.remove('/tmp/js/never-was')
      await rejects(sb.files.read('/tmp/js/nope'), e2b.FileNotFoundError)
      await rejects(sb.files.getInfo('/tmp/js/nope'), e2b.FileNotFoundError)
      await rejects(sb.files.list('/tmp/js/nope'), e2b.FileNotFoundError)

      // a watch: what the SDK and a command do, as envd's event types
      await sb.files.makeDir('/tmp/w')
      const events = []
      let exited = null
      const watch = await sb.files.watchDir('/tmp/w', (ev) => events.push(ev), {
        recursive: true,
        includeEntry: true,
        onExit: (err) => {
          exited = err || 'ended'
        },
      })
      const names = (type) => events.filter((e) => e.type === type).map((e) => e.name)
      await sb.files.write('/tmp/w/new.txt', 'x')
      const seen = () => JSON.stringify(events.map((e) => [e.type, e.name]))
      await until('CREATE and WRITE', () => names(FilesystemEventType.CREATE).includes('new.txt') && names(FilesystemEventType.WRITE).includes('new.txt'), 30000, seen)
      const made = events.find((e) => e.type === FilesystemEventType.CREATE && e.name === 'new.txt')
      assert.equal(made.entry && made.entry.path, '/tmp/w/new.txt')
      assert.equal(made.entry.type, FileType.FILE)
      await sb.files.makeDir('/tmp/w/sub')
      await until('the directory', () => names(FilesystemEventType.CREATE).includes('sub'))
      await sb.commands.run('sleep 0.2; echo y > /tmp/w/sub/deep.txt')
      await until('a file in a directory made later', () => names(FilesystemEventType.CREATE).includes('sub/deep.txt'))
      await sb.files.rename('/tmp/w/new.txt', '/tmp/w/renamed.txt')
      await until('RENAME', () => names(FilesystemEventType.RENAME).includes('new.txt'))
      await sb.commands.run('chmod 600 /tmp/w/renamed.txt')
      await until('CHMOD', () => names(FilesystemEventType.CHMOD).includes('renamed.txt'))
      await sb.files.remove('/tmp/w/renamed.txt')
      await until('REMOVE', () => names(FilesystemEventType.REMOVE).includes('renamed.txt'))
      assert.equal(exited, null) // the watch ran until stopped (its onExit then gets the SDK's abort)
      await watch.stop()
      await rejects(sb.files.watchDir('/tmp/w/none', () => {}), e2b.FileNotFoundError, /No such file/)

      // a jail whose share of inotify instances is taken (here by a program of its own) is watched by polling
      const hog =
        'import ctypes, sys, time\nlibc = ctypes.CDLL(None)\nn = 0\n' +
        'while n < 4096 and libc.inotify_init1(0) >= 0:\n    n += 1\n' +
        'print(n, flush=True)\ntime.sleep(300)\n'
      await sb.files.write('/tmp/hog.py', hog)
      const holder = await sb.commands.run('python3 /tmp/hog.py', { background: true })
      await until('the instances taken', () => holder.stdout.trim() !== '')
      assert.ok(Number(holder.stdout.trim()) < 4096, holder.stdout)
      const polled = []
      const pollWatch = await sb.files.watchDir('/tmp/w', (ev) => polled.push(ev))
      await sb.files.write('/tmp/w/polled.txt', 'p')
      await until('a polled CREATE', () => polled.some((e) => e.type === FilesystemEventType.CREATE && e.name === 'polled.txt'))
      await pollWatch.stop()
      await holder.kill()
    } finally {
      await sb.kill()
    }
  },

  // a port through getHost, signed URLs, a private port's traffic token
  async host() {
    const sb = await Sandbox.create('host', { secure: true })
    const closed = await Sandbox.create('host', { network: { allowPublicTraffic: false } })
    try {
      const host = sb.getHost(8080)
      assert.equal(host, `8080-${sb.sandboxId}.localhost:${SERVER.port}`)
      await sb.files.write('/tmp/site/index.html', 'served from the sandbox')
      await sb.commands.run('python3 -m http.server 8080 --bind 127.0.0.1 --directory /tmp/site', { background: true })
      const r = await until('the sandbox server', async () => {
        const got = await viaHost(host, '/index.html')
        return got.status === 502 ? null : got
      })
      assert.equal(r.status, 200)
      assert.equal(r.body.toString(), 'served from the sandbox')
      const none = await viaHost(sb.getHost(8081))
      assert.equal(none.status, 502)
      assert.match(none.body.toString(), /nothing listens on its port 8081/)

      // a private sandbox's port: only with its traffic token
      assert.ok(closed.trafficAccessToken)
      await closed.commands.run('python3 -m http.server 8080 --bind 127.0.0.1 --directory /etc', { background: true })
      const token = { 'e2b-traffic-access-token': closed.trafficAccessToken }
      const opened = await until('the private server', async () => {
        const got = await viaHost(closed.getHost(8080), '/hostname', token)
        return got.status === 502 ? null : got
      })
      assert.equal(opened.status, 200)
      assert.equal((await viaHost(closed.getHost(8080), '/hostname')).status, 502)

      // signed URLs: no header at all, only what they were signed for
      await sb.files.write('/tmp/a.txt', 'secret a')
      for (const useSignatureExpiration of [undefined, 60]) {
        const got = await fetch(await sb.downloadUrl('/tmp/a.txt', { useSignatureExpiration }))
        assert.deepEqual([got.status, await got.text()], [200, 'secret a'])
      }
      const form = new FormData()
      form.append('file', new Blob(['uploaded']), 'up.txt')
      const up = await fetch(await sb.uploadUrl('/tmp/up.txt', { useSignatureExpiration: 60 }), { method: 'POST', body: form })
      assert.equal(up.status, 200, await up.text())
      assert.equal(await sb.files.read('/tmp/up.txt'), 'uploaded')
      const readA = await sb.downloadUrl('/tmp/a.txt', { useSignatureExpiration: 60 })
      const changed = (name, value) => {
        const u = new URL(readA)
        u.searchParams.set(name, value)
        return u.toString()
      }
      for (const url of [changed('path', '/tmp/up.txt'), changed('username', 'nobody'), await sb.downloadUrl('/tmp/a.txt', { useSignatureExpiration: -10 })]) {
        const got = await fetch(url)
        assert.equal(got.status, 401, url)
        assert.ok((await got.json()).message)
      }
      const forged = await getSignature({ path: '/tmp/a.txt', operation: 'read', user: undefined, envdAccessToken: 'not-the-token' })
      assert.equal((await fetch(changed('signature', forged.signature))).status, 401)
    } finally {
      await Promise.allSettled([sb.kill(), closed.kill()])
    }
  },

  // network options at create and while it runs, within a server of --network none
  async network() {
    const dark = await Sandbox.create('host', { allowInternetAccess: false })
    try {
      assert.equal((await dark.commands.run('echo dark')).stdout, 'dark\n')
      await rejects(
        Sandbox.create('host', { network: { allowOut: ['10.1.2.3'] } }),
        e2b.SandboxError,
        /--network/
      )
      const open = await Sandbox.create('host', { allowInternetAccess: true }) // E2B's default: all the server allows
      assert.equal((await open.commands.run('echo open')).stdout, 'open\n')
      await open.kill()
      await rejects(dark.updateNetwork({ allowOut: ['10.1.2.3'] }), e2b.SandboxError, /--network/)
      await dark.updateNetwork({ allowInternetAccess: false })
      await rejects(
        Sandbox.create('host', { network: { allowOut: ['not a cidr/99'], denyOut: ['0.0.0.0/0'] } }),
        e2b.SandboxError
      )
    } finally {
      await dark.kill()
    }
  },

  // what is not served: the SDK's own error, naming what is missing
  async unserved() {
    const sb = await Sandbox.create('host')
    try {
      await rejects(sb.getMcpToken(), e2b.FileNotFoundError)
      const mcp = new URL(sb.getMcpUrl()) // https: no TLS here; its name to the server's address finds no gateway
      const gateway = await viaHost(mcp.host, mcp.pathname)
      assert.equal(gateway.status, 502)
      assert.match(gateway.body.toString(), /nothing listens on its port/)
      await rejects(Sandbox.create('host', { volumeMounts: { '/mnt/data': 'vol' } }), e2b.SandboxError, /volumeMounts: volumes are not served/)
      const iam = { tokens: { gcp: { audience: 'x', tokenType: 'oidc' } } }
      await rejects(Sandbox.create('host', { iam }), e2b.SandboxError, /iam: IAM tokens are not served/)
      await rejects(e2b.Volume.create('v'), e2b.VolumeError, /POST \/volumes is not served by jailbox/)
      await rejects(e2b.Secret.list().nextItems(), e2b.SecretError, /GET \/secrets is not served by jailbox/)
    } finally {
      await sb.kill()
    }
  },

  // the public methods of the classes a user calls, as "Class.method" (static and instance alike), for
  // the table of docs/e2b-compat.md; what TypeScript declares private or protected is left out
  async methods() {
    const ci = require('@e2b/code-interpreter')
    const hidden = new Set([
      'constructor', 'createSandbox', 'forkSandbox', 'connectSandbox', 'resolveOpts', 'resolveApiOpts',
      'fileUrl', 'start', 'getJupyterRequestUrl', 'handleRequestError',
    ])
    const functions = (o) =>
      Object.getOwnPropertyNames(o).filter((n) => !hidden.has(n) && typeof Object.getOwnPropertyDescriptor(o, n).value === 'function')
    const sb = await Sandbox.create('host')
    try {
      const names = new Set()
      const add = (cls, o) => functions(o).forEach((n) => names.add(`${cls}.${n}`))
      add('Sandbox', Sandbox)
      add('Sandbox', Object.getPrototypeOf(Sandbox))
      add('Sandbox', Sandbox.prototype)
      add('Filesystem', Object.getPrototypeOf(sb.files))
      add('Commands', Object.getPrototypeOf(sb.commands))
      add('Pty', Object.getPrototypeOf(sb.pty))
      add('CodeSandbox', ci.Sandbox.prototype)
      console.log('methods ' + JSON.stringify([...names].sort()))
    } finally {
      await sb.kill()
    }
  },

  // @e2b/code-interpreter: runCode, results, errors, callbacks, contexts
  async interpreter() {
    const ci = require('@e2b/code-interpreter')
    const sb = await ci.Sandbox.create()
    try {
      const first = await sb.runCode("x = 41\nprint('hi')\nx + 1")
      assert.equal(first.text, '42')
      assert.deepEqual(first.logs.stdout, ['hi\n'])
      assert.equal(first.error, undefined)
      assert.equal(first.results[0].isMainResult, true)
      assert.equal((await sb.runCode('x * 2', { language: 'python' })).text, '82')

      const plot = await sb.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()')
      assert.equal(plot.results.length, 1)
      const [figure] = plot.results
      assert.ok(figure.png && !figure.isMainResult && figure.formats().includes('png'), figure)
      assert.deepEqual([...Buffer.from(figure.png, 'base64').subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])

      const failed = await sb.runCode('def f():\n    return 1 / 0\nf()')
      assert.equal(failed.error.name, 'ZeroDivisionError')
      assert.equal(failed.error.value, 'division by zero')
      assert.match(failed.error.traceback, /f\(\)/)
      assert.equal((await sb.runCode('x')).text, '41')

      const seen = []
      await sb.runCode(
        "import sys\nprint('a'); sys.stdout.flush()\nprint('b', file=sys.stderr); sys.stderr.flush()\n" +
          "display(1)\nprint('c'); sys.stdout.flush()\n1 / 0",
        {
          onStdout: (m) => seen.push(['out', m.line, m.error]),
          onStderr: (m) => seen.push(['err', m.line, m.error]),
          onResult: (r) => seen.push(['result', r.text, r.isMainResult]),
          onError: (e) => seen.push(['error', e.name]),
        }
      )
      assert.deepEqual(seen, [
        ['out', 'a\n', false],
        ['err', 'b\n', true],
        ['result', '1', false],
        ['out', 'c\n', false],
        ['error', 'ZeroDivisionError'],
      ])
      const env = await sb.runCode("import os\nos.environ.get('ASKED')", { envs: { ASKED: 'per-run' } })
      assert.equal(env.text, 'per-run')

      const ctx = await sb.createCodeContext({ cwd: '/tmp' })
      assert.equal(ctx.language, 'python')
      assert.equal(ctx.cwd, '/tmp')
      assert.equal((await sb.runCode('import os\nos.getcwd()', { context: ctx })).text, '/tmp')
      await sb.runCode('y = 7', { context: ctx })
      assert.equal((await sb.runCode('y', { context: ctx })).text, '7')
      assert.equal((await sb.runCode("'y' in globals()")).text, 'False')
      assert.ok((await sb.listCodeContexts()).some((c) => c.id === ctx.id))
      await sb.restartCodeContext(ctx)
      assert.equal((await sb.runCode('y', { context: ctx })).error.name, 'NameError')
      await sb.removeCodeContext(ctx.id)
      assert.ok(!(await sb.listCodeContexts()).some((c) => c.id === ctx.id))
      await rejects(sb.runCode('1', { context: ctx, language: 'python' }), e2b.InvalidArgumentError)
      // the SDK shows a failure's status line only: its reason phrase names what is missing
      await rejects(sb.createCodeContext({ language: 'r' }), e2b.SandboxError, /^400 Bad Request: language 'r' has no kernel/)
      await rejects(sb.runCode('1', { language: 'javascript' }), e2b.SandboxError, /only Python runs here/)
      await rejects(sb.restartCodeContext('no-such-context'), e2b.NotFoundError)

      // the SDK's read deadline: its own TimeoutError (the server interrupts the run at its next keepalive)
      const slow = await sb.createCodeContext()
      await rejects(sb.runCode('import time\ntime.sleep(30)', { context: slow, timeoutMs: 500 }), e2b.TimeoutError)
    } finally {
      await sb.kill()
    }
  },
}

async function main() {
  const names = process.argv.slice(2)
  for (const name of names) {
    if (!(name in scenarios)) throw new Error(`no scenario ${name}: ${Object.keys(scenarios).join(', ')}`)
  }
  for (const name of names) {
    const started = Date.now()
    await scenarios[name]()
    console.log(`ok ${name} ${Date.now() - started} ms`)
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err && err.stack ? err.stack : err)
    process.exit(1)
  }
)
