// Runs a package's tape test files in this process and writes one JSON line per test to TARGET (a descriptor, a pipe
// that only the process running this one can read; or a file path), then a closing line with the count of lines it
// wrote and what it saw go wrong. The record format is the one pytest's report plugin writes (nodeid, when, outcome).
//
//     node THIS_FILE TEST_FILE...      (run in the package's directory)
//
// Test ids are "FILE::NAME" (nested tests "FILE::PARENT > CHILD"; a repeated name gets " #2", " #3", ...). A test
// fails when one of its assertions fails (todo ones excepted), is skipped when tape skips it, and is absent when it
// never ended (a crash); an uncaught exception ends the run, and the closing line records it.
//
// The code under test shares this process. The closing line also says what could be seen of it changing how tests
// run: a test file whose code as compiled is not the file on disk (or that was never compiled from it), a test
// registered from anywhere but a test file, and tape's own functions replaced.
'use strict';

var TARGET = 3;  // set when installed

var fs = require('fs');
var path = require('path');
var Module = require('module');

var files = process.argv.slice(2);
var fd = typeof TARGET === 'number' ? TARGET : fs.openSync(TARGET, 'w');
var writeSync = fs.writeSync;
var stringify = JSON.stringify;
var lines = 0;
var problems = [];

function emit(record) {
    writeSync(fd, stringify(record) + '\n');
    lines += 1;
}

var closed = false;
function close() {  // once: when tape's stream ends, or at exit if it never does (a crash, a process.exit)
    if (closed) { return; }
    closed = true;
    check();
    writeSync(fd, stringify({ nodeid: '', when: 'end', lines: lines, tampered: problems.length ? problems : null })
        + '\n');
}
process.on('exit', close);  // before tape is loaded: its own exit handler may end the process

// Each test file as on disk, and as compiled: a compile hook or a loader that swaps the file shows as a difference.
var onDisk = {};
var compiled = {};
function withoutBOM(text) { return text.charCodeAt(0) === 0xFEFF ? text.slice(1) : text; }
files.forEach(function (file) { onDisk[path.resolve(file)] = withoutBOM(fs.readFileSync(file, 'utf8')); });
var compile = Module.prototype._compile;
Module.prototype._compile = function (content, filename) {
    if (Object.prototype.hasOwnProperty.call(onDisk, filename)) {
        compiled[filename] = withoutBOM(String(content));
    }
    return compile.apply(this, arguments);
};

var tapePath = Module.createRequire(path.join(process.cwd(), 'index.js')).resolve('tape');
var tape = require(tapePath);
var Test = require(path.join(path.dirname(tapePath), 'lib', 'test.js'));
var kept = {};
['_assert', 'run', 'end', 'test', 'skip', 'fail', 'pass', 'equal', 'deepEqual', 'ok', 'notOk', 'notEqual',
    'notDeepEqual', 'throws'].forEach(function (name) { kept[name] = Test.prototype[name]; });
var stream = tape.createStream({ objectMode: true });

// Which file registered each top-level test: tape runs them in registration order. A test registered from
// anywhere but the test file being loaded is recorded as a problem.
var fileQueue = [];
var currentFile = null;
var here = path.resolve(__filename);
var tapeDir = path.dirname(tapePath) + path.sep;
function caller() {
    var stack = String(new Error().stack).split('\n').slice(1);
    for (var i = 0; i < stack.length; i++) {
        var match = /\(?((?:\/|file:\/\/)[^():]+):\d+:\d+\)?\s*$/.exec(stack[i]);
        if (match && match[1] !== here && match[1].indexOf(tapeDir) !== 0) {
            return match[1].replace(/^file:\/\//, '');
        }
    }
    return null;
}
function isTestFile(file) {
    var relative = file === null ? '..' : path.relative(process.cwd(), file);
    return relative.indexOf('..') !== 0 && /(^|\/)tests?\//.test(relative) && relative.indexOf('node_modules') < 0;
}
function wrap(original) {
    return function (name) {
        var from = caller();
        if (!isTestFile(from)) {
            problems.push('a test (' + String(name).slice(0, 80) + ') was registered from ' + from + ', not a test file');
        }
        if (currentFile !== null) { fileQueue.push(currentFile); }
        return original.apply(this, arguments);
    };
}
var wrapped = wrap(tape);
Object.keys(tape).forEach(function (key) { wrapped[key] = tape[key]; });
wrapped.test = wrapped;
wrapped.only = wrap(tape.only);
wrapped.skip = wrap(tape.skip);
require.cache[tapePath].exports = wrapped;

var tests = {};  // tape id -> {nodeid, failed, skip, ended}
var seen = {};
stream.on('data', function (row) {
    if (row.type === 'test') {
        var parent = row.parent !== undefined ? tests[row.parent] : null;
        var file = parent ? parent.file : (fileQueue.shift() || '?');
        var name = parent ? parent.name + ' > ' + row.name : row.name;
        var nodeid = file + '::' + name;
        seen[nodeid] = (seen[nodeid] || 0) + 1;
        if (seen[nodeid] > 1) { nodeid += ' #' + seen[nodeid]; }
        tests[row.id] = { nodeid: nodeid, file: file, name: name, failed: false, skip: !!row.skip, ended: false,
            start: Date.now() };
    } else if (row.type === 'assert') {
        var test = tests[row.test];
        if (test && !row.ok && !row.todo && !row.skip) {
            test.failed = true;
        }
    } else if (row.type === 'end') {
        var done = tests[row.test];
        if (done && !done.ended) {
            done.ended = true;
            var outcome = done.skip ? 'skipped' : (done.failed ? 'failed' : 'passed');
            emit({ nodeid: done.nodeid, when: 'call', outcome: outcome, duration: (Date.now() - done.start) / 1000 });
        }
    }
});

function check() {
    Object.keys(onDisk).forEach(function (file) {
        var shown = path.relative(process.cwd(), file);
        if (!Object.prototype.hasOwnProperty.call(compiled, file)) {
            problems.push(shown + ' was not compiled from its file');
        } else if (compiled[file] !== onDisk[file]) {
            problems.push(shown + ' was compiled from code that is not the file on disk');
        }
    });
    Object.keys(kept).forEach(function (name) {
        if (Test.prototype[name] !== kept[name]) { problems.push("tape's Test.prototype." + name + ' was replaced'); }
    });
}

process.on('uncaughtException', function (error) {
    problems.push('uncaught exception: ' + String(error && error.stack || error).split('\n')[0]);
    process.exitCode = 1;
});
stream.on('end', close);

files.forEach(function (file) {
    currentFile = file;
    require(path.resolve(file));
});
currentFile = null;
