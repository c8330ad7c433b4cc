"""The messages a learner reads from the kit, in the edition they chose (English by default).

Why English templates as keys: the English stays readable where it is used (``tr("rank {rank}
failed", rank=3)``), a message without a translation falls back to English instead of failing,
and tests/test_editions.py finds every ``tr(...)`` in the source and checks that the Chinese
catalogue below translates it with the same ``{fields}``.

The edition is chosen by ``DISTLAB_LANG`` (``make lab LANG=zh`` sets it for JupyterLab and its
kernels), or, when that is unset, by where the notebook runs: a kernel started in the course's
``notebooks/zh/`` folder speaks Chinese.
"""

from __future__ import annotations

import os
from pathlib import Path

LANGUAGES = ("en", "zh")


def language() -> str:
    """'zh' or 'en': the environment's choice, else the edition of the notebook folder."""
    chosen = os.environ.get("DISTLAB_LANG", "").strip().lower()[:2]
    if chosen in LANGUAGES:
        return chosen
    try:
        here = Path.cwd()
    except OSError:
        return "en"
    if here.name == "zh" and (here.parent / "00_welcome.ipynb").exists():
        return "zh"
    return "en"


def tr(template: str, lang: str | None = None, /, **fields: object) -> str:
    """``template`` in the chosen language, with ``fields`` filled in."""
    lang = lang or language()
    text = ZH.get(template, template) if lang == "zh" else template
    return text.format(**fields) if fields else text


def passed(*values: object, note: str = "") -> None:
    """Print a notebook self-check's success line in the learner's language."""
    head = tr("self-check passed")
    tail = " ".join(str(v) for v in ([tr(note)] if note else []) + list(values))
    colon = "：" if language() == "zh" else ": "  # Chinese text takes the full-width colon
    print(f"{head}{colon}{tail}" if tail else head)


ZH: dict[str, str] = {
    # notebook self-checks
    "self-check passed": "自测通过",
    "by hand = DDP = ZeRO-2 = one process on the full batch":
        "手写版 = DDP = ZeRO-2 = 单进程全 batch 训练",
    "the table's arithmetic holds and reduce_scatter + all_gather is an all_reduce":
        "表格的算术成立，reduce_scatter + all_gather 就是一次 all_reduce",
    # the cell magic: what it prints
    "distlab: {n} ranks ready ({backend})": "distlab：{n} 个 rank 已就绪（{backend}）",
    "distlab: pool stopped": "distlab：rank 池已停止",
    "distlab: pool restarted, {n} fresh ranks ({backend})":
        "distlab：rank 池已重启，{n} 个全新的 rank（{backend}）",
    "distlab: no pool (the first %%dist cell starts one)":
        "distlab：没有 rank 池（第一个 %%dist 单元格会启动一个）",
    "distlab: restarting the pool with {n} ranks ({backend}); it had {old} ({old_backend}). "
    "Variables on the old ranks are gone.":
        "distlab：用 {n} 个 rank（{backend}）重启 rank 池；原来是 {old} 个（{old_backend}）。"
        "旧 rank 上的变量都没了。",
    # the cell magic: wrong options
    "-n must be between 1 and {most}, got {value}": "-n 必须在 1 到 {most} 之间，收到的是 {value}",
    "--timeout must be positive, got {value}": "--timeout 必须为正数，收到的是 {value}",
    "no pool is running: run a %%dist cell or %dist_start first":
        "没有正在运行的 rank 池：先运行一个 %%dist 单元格或 %dist_start",
    "{name} is not defined in the kernel": "内核里没有定义 {name}",
    "--launcher {launcher} needs --iface: the network interface the ranks reach this kernel on":
        "--launcher {launcher} 需要 --iface：各个 rank 用来连接本内核的网络接口",
    "--iface {spec}: {host} has no network interface {spec} with an IPv4 address; if the nodes name it "
    "differently, give its subnet (--iface 10.1.0.0/16)":
        "--iface {spec}：{host} 上没有带 IPv4 地址的网络接口 {spec}；如果各节点给它起的名字不同，"
        "请改用它的子网（--iface 10.1.0.0/16）",
    "--iface {spec}: neither an interface name nor a subnet ({why})":
        "--iface {spec}：既不是网络接口名，也不是子网（{why}）",
    "--iface {spec}: no network interface of {host} has an address in {spec}":
        "--iface {spec}：{host} 上没有任何网络接口的地址在 {spec} 之内",
    "--ranks expects a list like 0,2 or 1-3, got {text}": "--ranks 需要 0,2 或 1-3 这样的列表，收到的是 {text}",
    "--ranks range {part} is backwards": "--ranks 的范围 {part} 写反了",
    "--ranks {text}: rank {rank} does not exist with {n} ranks (0-{last})":
        "--ranks {text}：共 {n} 个 rank（0-{last}），不存在 rank {rank}",
    # failures and hangs
    "{failed} of {n} ranks failed": "{n} 个 rank 中有 {failed} 个失败",
    "the cell ran past its {timeout} s deadline: {ranks} still running (a deadlock, or raise --timeout)":
        "单元格超过了 {timeout} 秒的截止时间：{ranks} 仍在运行（死锁，或者调大 --timeout）",
    "{bad} failed and {stuck} hung waiting for it (stopped {grace} s later)":
        "{bad} 失败了，{stuck} 因等待它而卡住（{grace} 秒后被停止）",
    "{bad} failed and {stuck} hung waiting for them (stopped {grace} s later)":
        "{bad} 失败了，{stuck} 因等待它们而卡住（{grace} 秒后被停止）",
    "interrupted; {ranks} did not stop within {grace} s and were killed":
        "已中断；{ranks} 在 {grace} 秒内没有停下，已被强制结束",
    "interrupted; {ranks} did not stop within {grace} s and was killed":
        "已中断；{ranks} 在 {grace} 秒内没有停下，已被强制结束",
    "interrupted: every rank stopped": "已中断：每个 rank 都已停止",
    "the rank kept more than {mb} MB of files in its temporary folder (or over {entries} files), more than a "
    "grading rank may, and was stopped":
        "这个 rank 在它的临时文件夹里存放了超过 {mb} MB 的文件（或超过 {entries} 个文件），超出了评分 rank 的上限，已被停止",
    "the rank ended with its launcher (the process that forks the ranks), which was killed or crashed; fresh "
    "ranks start with a new one":
        "这个 rank 随它的启动器（负责 fork 出各个 rank 的进程）一起结束了，启动器被杀死或崩溃；新的 rank 会由新的启动器启动",
    "interrupted twice; {ranks} were killed at once": "中断了两次；{ranks} 已被立即强制结束",
    "interrupted twice; {ranks} was killed at once": "中断了两次；{ranks} 已被立即强制结束",
    "interrupted while the ranks were starting: nothing ran, and nothing is left queued or running. The next "
    "cell starts them again.":
        "在 rank 启动期间被中断：什么都没有运行，也没有留下排队或运行中的任务。下一个单元格会重新启动它们。",
    "interrupted while the ranks were starting: nothing ran on them. The next cell waits for them again.":
        "在 rank 启动期间被中断：它们什么都没有运行。下一个单元格会再次等待它们就绪。",
    "interrupted while the old ranks were stopping: they are stopped, nothing ran. The next cell starts {n} fresh ranks.":
        "在旧的 rank 停止期间被中断：它们已经停止，什么都没有运行。下一个单元格会启动 {n} 个全新的 rank。",
    "Rank state was lost: every rank was stopped and the pool restarted with {n} fresh ranks ({backend}).":
        "rank 上的状态已丢失：每个 rank 都被停止，rank 池已用 {n} 个全新的 rank 重启（{backend}）。",
    "the rank process ended (exit status unknown)": "rank 进程结束了（退出状态未知）",
    "the kernel lost its connection to the rank: its process ended, or its node or the network to it went down":
        "内核与该 rank 的连接断了：它的进程已结束，或者它所在的节点、或通往该节点的网络出了故障",
    "the rank process was killed by {signal}": "rank 进程被 {signal} 杀死",
    "the rank process exited with code {code}": "rank 进程以退出码 {code} 退出",
    "waiting at {where}": "等待于 {where}",
    "{ranks} on node {node}": "{ranks} 在节点 {node} 上",
    "at cell line {line}: {text}": "在单元格第 {line} 行：{text}",
    "cell line {line}: {text}": "单元格第 {line} 行：{text}",
    "no Python stack (the rank did not answer)": "没有 Python 调用栈（该 rank 没有响应）",
    "the ranks could not start their process group ({backend}):\n{detail}":
        "各个 rank 无法建立进程组（{backend}）：\n{detail}",
    "the ranks did not start within {seconds} s": "各个 rank 没有在 {seconds} 秒内启动",
    "distlab: on a cluster this kernel cannot see the nodes' GPUs, so the ranks use gloo; --backend nccl "
    "gives each rank the GPU of its SLURM_LOCALID.":
        "distlab：在集群上，本内核看不到各节点的 GPU，所以这些 rank 使用 gloo；--backend nccl 会让每个 rank "
        "使用编号为其 SLURM_LOCALID 的 GPU。",
    "distlab: NCCL needs one GPU per rank, and a node has fewer ({nodes}): the ranks use gloo instead.":
        "distlab：NCCL 要求每个 rank 独占一块 GPU，而有节点的 GPU 不够（{nodes}）：所以这些 rank 改用 gloo。",
    "the allocation lost node {nodes}": "分配的资源失去了节点 {nodes}",
    "distlab: the allocation lost node {nodes}: SLURM starts no rank there until it is back (or ask for "
    "other nodes with %dist_start --srun-args).":
        "distlab：分配的资源失去了节点 {nodes}：在它恢复之前，SLURM 不会在那里启动 rank"
        "（也可以用 %dist_start --srun-args 申请别的节点）。",
    "distlab: SLURM has not started the ranks yet: {pending}. Waiting; interrupt the cell to withdraw "
    "the request.": "distlab：SLURM 还没有启动这些 rank：{pending}。正在等待；中断单元格即可撤回请求。",
    "--backend nccl needs one GPU per rank: {n} ranks but {gpus} GPU(s) visible. "
    "Use --backend gloo to run on the CPU, or fewer ranks.":
        "--backend nccl 要求每个 rank 一张 GPU：有 {n} 个 rank，但只看得到 {gpus} 张 GPU。"
        "用 --backend gloo 在 CPU 上运行，或者减少 rank 数。",
    "{what} cannot be sent to the ranks ({error}). Send plain data (numbers, lists, tensors) or functions.":
        "{what}无法发送给各个 rank（{error}）。请发送普通数据（数字、列表、张量）或函数。",
    "{what} cannot be sent to the kernel ({error}). Return plain data (numbers, lists, tensors) instead.":
        "{what}无法发送回 kernel（{error}）。请改为返回普通数据（数字、列表、张量）。",
    "the value of {name!r}": "变量 {name!r} 的值",
    "the function's result": "函数的返回值",
    "the function or its arguments": "函数或它的参数",
    "rank {rank}'s value cannot be rebuilt in the kernel ({error}). Classes and functions defined in "
    "%%dist cells come along; a type from a module that only the ranks can import does not: return plain "
    "data (numbers, lists, tensors) instead.":
        "rank {rank} 的值无法在 kernel 里重建（{error}）。在 %%dist 单元格里定义的类和函数会随值一起传回；"
        "只有 rank 能导入的模块里的类型不行：请改为返回普通数据（数字、列表、张量）。",
    "distlab: the ranks already form a process group ({n} ranks, {backend}), so this init_process_group call "
    "was skipped and its {wanted} does not apply. Run the cell with %%dist -n N --backend B to change them.":
        "distlab：这些 rank 已经组成了进程组（{n} 个 rank，{backend}），所以这次 init_process_group 调用被跳过，"
        "其中的 {wanted} 不会生效。要改变它们，请用 %%dist -n N --backend B 运行这个单元格。",
    "{what} runs in the kernel, not on the ranks: put it in a cell of its own. The ranks use the kernel's "
    "Python, so the next %%dist cell can import what it installed.":
        "{what} 在 kernel 里运行，不在各个 rank 上运行：请把它放到单独的单元格里。各个 rank 用的是 kernel 的 Python，"
        "所以下一个 %%dist 单元格就能 import 刚装好的包。",
    "{what} runs in the kernel, not on the ranks: put it in a cell of its own. On the ranks a cell may use "
    "%time, %timeit, %run, %env, %cd, %pwd, %matplotlib and !commands.":
        "{what} 在 kernel 里运行，不在各个 rank 上运行：请把它放到单独的单元格里。在 rank 上，单元格可以用 "
        "%time、%timeit、%run、%env、%cd、%pwd、%matplotlib 和 !命令。",
    "distlab forks its ranks from a process that has imported torch once, and Windows cannot fork "
    "a process. Run JupyterLab in WSL (Windows Subsystem for Linux, e.g. Ubuntu): there `make lab` "
    "works as on Linux.":
        "distlab 的各个 rank 是从一个已经 import 过 torch 的进程 fork 出来的，而 Windows 不能 fork 进程。"
        "请在 WSL（Windows 的 Linux 子系统，例如 Ubuntu）里运行 JupyterLab：在那里 `make lab` 和在 Linux 上一样可用。",
    "%cd on the ranks takes one folder, not {line!r}":
        "rank 上的 %cd 只接受一个文件夹，不接受 {line!r}",
    "%run on the ranks takes a script and its arguments (%run train.py --epochs 2), -i to run it among the "
    "cell's names, or -m module; not {line!r}":
        "rank 上的 %run 接受一个脚本及其参数（%run train.py --epochs 2）、-i（在单元格的变量之中运行），"
        "或 -m 模块；不接受 {line!r}",
    "%timeit on the ranks takes -n, -r, -p, -q and -o, not {word}":
        "rank 上的 %timeit 接受 -n、-r、-p、-q 和 -o，不接受 {word}",
    "%timeit -{flag} needs a whole number, not {value!r}":
        "%timeit -{flag} 需要一个整数，而不是 {value!r}",
    "(If no one killed it, the usual cause is Linux's out-of-memory killer: the ranks together needed "
    "more memory than this machine or container has, and each rank holds its own copy of what a cell "
    "makes. Use smaller tensors or fewer ranks; the next cell starts fresh ranks.)":
        "（如果没有人杀掉它，通常是 Linux 的内存不足（OOM）机制所为：所有 rank 加起来需要的内存超过了这台机器或容器的容量，"
        "而每个 rank 都各自保存一份单元格创建的数据。请用更小的张量或更少的 rank；下一个单元格会启动全新的 rank。）",
    "(This rank has no GPU to use. Code written for GPUs runs here on the CPU: use "
    "init_process_group(\"gloo\") and the variable device, which every rank has (cpu here; "
    "cuda:N with %%dist --backend nccl on a machine with a GPU per rank), instead of \"cuda\"; FSDP "
    "takes device_id=device.)":
        "（这个 rank 没有可用的 GPU。为 GPU 写的代码在这里可以用 CPU 运行：用 init_process_group(\"gloo\")，"
        "并用每个 rank 都有的变量 device（这里是 cpu；在每个 rank 各有一张 GPU 的机器上用 %%dist --backend nccl "
        "时是 cuda:N）代替 \"cuda\"；FSDP 则传入 device_id=device。）",
    "(This rank may hold at most {limit} open files (RLIMIT_NOFILE), and the ranks live on from cell "
    "to cell: a cell that lowered that limit, or left files or sockets open, makes later cells fail "
    "here. Close what you opened, raise the limit with resource.setrlimit, or run %dist_restart for "
    "fresh ranks.)":
        "（这个 rank 最多只能同时打开 {limit} 个文件（RLIMIT_NOFILE），而 rank 会从一个单元格活到下一个单元格："
        "某个单元格调低了这个上限，或者留下了没关闭的文件或套接字，之后的单元格就会在这里失败。"
        "请关闭你打开的东西，用 resource.setrlimit 调高上限，或者运行 %dist_restart 换一批新的 rank。）",
    "Only {ran} ran this cell (--ranks), and a collective on the default group also waits for "
    "{absent}. Make a group of the ranks that run it in a cell every rank runs "
    "(g = dist.new_group([...])) and pass group=g.":
        "只有 {ran} 运行了这个单元格（--ranks），而默认进程组上的集合通信还要等 {absent}。"
        "请在一个所有 rank 都运行的单元格里，为运行它的那些 rank 建一个组（g = dist.new_group([...])），"
        "再传入 group=g。",
    "mp.Process({name}, args=({r}, {n}, ...)) starts rank {r} of {n}, and this cell has {w} ranks. "
    "Run the cell with %%dist -n {n}: each rank then runs {name} itself.":
        "mp.Process({name}, args=({r}, {n}, ...)) 要启动 {n} 个 rank 中的第 {r} 个，而这个单元格有 {w} 个 rank。"
        "请用 %%dist -n {n} 运行这个单元格：这样每个 rank 会自己运行 {name}。",
    "distlab: mp.Process runs {name}(rank, ...) on this cell's {n} ranks, which already are the "
    "processes it would start.":
        "distlab：mp.Process 在这个单元格的 {n} 个 rank 上运行 {name}(rank, ...)，因为这些 rank 本身就是它要启动的进程。",
    "distlab: this cell set {name} = {value} on rank {rank}, and later cells see that value. "
    "dist.get_rank() and dist.get_world_size() always tell the truth.":
        "distlab：这个单元格在 rank {rank} 上把 {name} 设成了 {value}，之后的单元格看到的都是这个值。"
        "dist.get_rank() 和 dist.get_world_size() 总是给出真实的值。",
    "a rank has no keyboard, so input() and sys.stdin cannot read here. Read the value in a normal cell, "
    "then copy it to the ranks with %dist_push NAME":
        "rank 没有键盘，所以 input() 和 sys.stdin 在这里读不到东西。请在普通单元格里读取这个值，"
        "再用 %dist_push NAME 把它复制到各个 rank。",
    "distlab: rank {rank} cannot enter the kernel's folder ({why}) and stays in {cwd}":
        "distlab：rank {rank} 无法进入内核所在的文件夹（{why}），仍留在 {cwd}",
    "distlab: the kernel refused a message from rank {rank} ({why})":
        "distlab：内核拒绝了来自 rank {rank} 的一条消息（{why}）",
    "(a widget on a rank cannot reach the browser: show widgets in a normal cell, "
    "and bring values over with %dist_pull)":
        "（rank 上的控件连不到浏览器：请在普通单元格里显示控件，再用 %dist_pull 把需要的值取过来）",
    "(SyncBatchNorm runs on GPUs only. On CPU ranks keep BatchNorm, which normalises each rank's "
    "own batch, or all_reduce the batch's sum and sum of squares yourself: that is all "
    "SyncBatchNorm adds.)":
        "（SyncBatchNorm 只能在 GPU 上运行。在只有 CPU 的 rank 上请继续用 BatchNorm，它对每个 rank "
        "自己的批次做归一化；或者自己用 all_reduce 汇总批次的和与平方和：SyncBatchNorm 多做的也就是这一步。）",
    "(argparse read the command line, and a rank has none: launcher.py in the usage line is "
    "distlab's. Give the arguments in the cell, p.parse_args([\"--lr\", \"0.1\"]), or set "
    "sys.argv = [\"train.py\", \"--lr\", \"0.1\"] before parsing.)":
        "（argparse 读的是命令行，而 rank 没有命令行：用法行里的 launcher.py 是 distlab 自己的。"
        "请在单元格里给出参数，例如 p.parse_args([\"--lr\", \"0.1\"])，或者在解析之前设置 "
        "sys.argv = [\"train.py\", \"--lr\", \"0.1\"]。）",
    "(A debugger cannot stop a rank: nobody can type to it, so breakpoint() and pdb quit at once. "
    "Print the values you want to see, or copy them to the kernel with %dist_pull NAME and look "
    "at them there.)":
        "（调试器无法让 rank 停下来：没有人能向它输入，所以 breakpoint() 和 pdb 会立刻退出。"
        "请打印你想看的值，或者用 %dist_pull NAME 把它们复制到内核里再查看。）",
    "mp.{entry}({name}, nprocs={n}) would start {n} processes on each of this cell's {w} ranks, and they could not "
    "import {name} from the cell. Run the cell with %%dist -n {n}: mp.{entry} then runs {name}(rank, ...) on the "
    "ranks themselves.":
        "mp.{entry}({name}, nprocs={n}) 会在这个单元格的 {w} 个 rank 上各自再启动 {n} 个进程，而这些进程无法从单元格里"
        "导入 {name}。请用 %%dist -n {n} 运行这个单元格：这样 mp.{entry} 会直接在各个 rank 上运行 {name}(rank, ...)。",
    "distlab: mp.{entry} runs {name}(rank, ...) on this cell's {n} ranks, which already are the processes it would "
    "start.":
        "distlab：mp.{entry} 在这个单元格的 {n} 个 rank 上运行 {name}(rank, ...)，因为这些 rank 本身就是它要启动的进程。",
    "distlab: {n} ranks, backend {backend}, generation {generation}, restarts {restarts}":
        "distlab：{n} 个 rank，后端 {backend}，第 {generation} 代，已重启 {restarts} 次",
    " on {node}": "（节点 {node}）",
    "  rank {rank}{where}: pid {pid}, {state}": "  rank {rank}{where}：进程号 {pid}，{state}",
    "idle": "空闲",
    "busy": "运行中",
    "starting": "启动中",
    "stopped": "已停止",
    "exited ({how})": "已退出（{how}）",
    "... {cut} more characters of output were not shown; the last {n} lines follow":
        "……还有 {cut} 个字符的输出没有显示；下面是最后 {n} 行",
    "the rank process is stopped (SIGSTOP, Ctrl-Z or a debugger holds it)":
        "该 rank 进程已被暂停（SIGSTOP、Ctrl-Z，或被调试器挂起）",
    "the rank process waits in the operating system (disk or network file system I/O)":
        "该 rank 进程正在操作系统里等待（磁盘或网络文件系统的 I/O）",
    "the rank process has exited": "该 rank 进程已经退出",
    # the per-rank table of torch.distributed calls (viz.trace_table_html)
    "op": "操作",
    "calls": "调用次数",
    "size": "大小",
    "sent": "发送",
    "received": "接收",
    "theoretical bus bytes": "理论总线字节数",
    "time (ms)": "时间 (ms)",
    "busbw (GB/s)": "总线带宽 busbw (GB/s)",
    "no torch.distributed calls": "没有 torch.distributed 调用",
    # figure labels (distlab.figure_text: in Chinese where a font can draw it), and the titles
    # the notebooks pass to timeline_figure in English, so that such a machine can fall back
    "time since first call (ms)": "距第一次调用的时间 (ms)",
    "torch.distributed calls per rank": "每个 rank 的 torch.distributed 调用",
    "message size (bytes)": "消息大小（字节）",
    "bus bandwidth": "总线带宽",
    "time per call (us)": "每次调用的时间 (us)",
    "alpha-beta model: t = alpha + beta * bytes": "alpha-beta 模型：t = alpha + beta * 字节数",
    "model: {model}": "模型：{model}",
    "one DDP step: each layer's backward (grey), bucket all_reduces":
        "DDP 的一步：每层的反向传播（灰色），各个桶的 all_reduce",
    # the ring stepper (replay.ring_stepper)
    "start": "开始",
    "step {k}": "第 {k} 步",
    "step {k} of {last}: {label}": "第 {k} 步，共 {last} 步：{label}",
    "step": "步",
    "previous step": "上一步",
    "next step": "下一步",
    "no buffer snapshots traced": "没有记录缓冲区快照",
    "no messages in this step": "这一步没有消息",
    # the grader's feedback
    "passed ({cases} cases, checked by the grader)": "通过（{cases} 个用例，由评分程序检查）",
    "the grader has no check for this cell": "评分程序没有检查这个单元格的用例",
    "not passed; the grader says: {reason}": "未通过。评分程序的说明（英文原文）：{reason}",
}
