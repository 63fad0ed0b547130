"""Start the command of ``vramscope run`` as a shell would exec it.

What the command gets is what it would have had without vramscope: every descriptor above 2 it
inherited (``3>f``, ``PMI_FD``, make's jobserver, socket activation), its ``argv[0]`` as typed, and
the shell's exit codes when it cannot be started (126: a directory, no x bit, a binary of another
format; 127: not found, a ``#!`` interpreter that does not exist); a script without ``#!`` runs with
``/bin/sh``, as the shell runs it.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Sequence


class ProgramNotFoundError(FileNotFoundError):
    """The command could not be started; :attr:`exit_code` is the shell's code for why (127 or 126)."""

    def __init__(self, message: str, exit_code: int = 127) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # 127: not found (or a bad interpreter); 126: found but cannot be run


def resolve_program(program: str) -> str:
    """The path of ``program`` to exec, or a :class:`ProgramNotFoundError` with the shell's exit code."""
    if os.sep in program:
        if os.path.isdir(program):
            raise ProgramNotFoundError(f"{program} is a directory; give the program to run", exit_code=126)
        if os.path.isfile(program) and os.access(program, os.X_OK):
            return program
        if os.path.exists(program):
            raise ProgramNotFoundError(f"{program} is not an executable file; check its permissions (chmod +x)",
                                       exit_code=126)
        raise ProgramNotFoundError(f"{program} does not exist; check the path")
    found = shutil.which(program)
    if found is None:
        # As the shell: a file of that name on PATH that cannot be executed is 126, not "not found".
        for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
            candidate = os.path.join(folder or os.curdir, program)
            if os.path.isfile(candidate):
                raise ProgramNotFoundError(f"{candidate} is not an executable file; check its permissions "
                                           "(chmod +x)", exit_code=126)
        raise ProgramNotFoundError(f"command not found: {program}; check the name or give its full path")
    return found


def inherited_fds() -> tuple[int, ...]:
    """The file descriptors above 2 this process inherited and would pass on at exec (not close-on-exec).

    ``bash -c 'echo hi >&3' 3>f``, MPI's ``PMI_FD``, make's jobserver, systemd's socket activation:
    the command must get them as it would without vramscope. Call it before vramscope opens anything
    (NVML's device files are opened without close-on-exec by the driver library).
    """
    fds = []
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if not name.isdigit() or int(name) <= 2:
                continue
            try:
                if os.get_inheritable(int(name)):
                    fds.append(int(name))
            except OSError:  # the listing's own descriptor, closed by now
                continue
        break
    return tuple(sorted(fds))


def spawn(program: str, command: list[str], env: dict[str, str], pass_fds: Sequence[int]) -> subprocess.Popen[bytes]:
    """Start the command as a shell would exec it; exec errors become the shell's exit codes.

    ``argv[0]`` is the name as typed (``executable`` is the path found). SIGPIPE and SIGXFSZ start at
    their defaults (``restore_signals``): what the caller had cannot be known inside Python, which
    ignores both before any of its code runs, and the default is what every shell gives a command.
    """
    descriptors = tuple(fd for fd in pass_fds if _still_inheritable(fd))
    try:
        return subprocess.Popen(command, executable=program, env=env, pass_fds=descriptors)
    except OSError as exc:
        if exc.errno == errno.ENOEXEC:  # no #! line: the shell runs it with /bin/sh, and so do we
            if _looks_binary(program):  # ... unless it is a binary of another kind, as bash tells them apart
                raise ProgramNotFoundError(f"cannot execute binary file {command[0]}: Exec format error",
                                           exit_code=126) from None
            try:
                return subprocess.Popen(["/bin/sh", program, *command[1:]], env=env, pass_fds=descriptors)
            except OSError as again:
                raise ProgramNotFoundError(f"cannot run {command[0]} with /bin/sh: {again.strerror}",
                                           exit_code=126) from None
        if exc.errno == errno.ENOENT:  # the program exists (it was found): its #! interpreter does not
            raise ProgramNotFoundError(f"{command[0]}: bad interpreter {_interpreter(program)!r}: no such "
                                       "program; fix the script's #! line", exit_code=127) from None
        raise ProgramNotFoundError(f"cannot execute {command[0]}: {exc.strerror or exc}", exit_code=126) from None


def _still_inheritable(fd: int) -> bool:
    try:
        return os.get_inheritable(fd)
    except OSError:
        return False


def _looks_binary(program: str) -> bool:
    """A NUL byte before the first line end of the first 80 bytes: not a script (bash's test)."""
    try:
        with open(program, "rb") as handle:
            head = handle.read(80)
    except OSError:
        return False
    return b"\0" in head.partition(b"\n")[0]


def _interpreter(program: str) -> str:
    """The program a script's ``#!`` line names (for the message of a bad interpreter)."""
    try:
        with open(program, "rb") as handle:
            first = handle.readline(256)
    except OSError:
        return "?"
    if not first.startswith(b"#!"):
        return "?"
    words = first[2:].split()
    return words[0].decode(errors="replace") if words else "?"
