//! The thread pool behind `TVMBackendParallelLaunch` and `TVMBackendParallelBarrier`.
//!
//! Compiled code runs a parallel loop by calling `ParallelLaunch(lambda, cdata, num_task)`:
//! the runtime calls `lambda(task_id, env, cdata)` for every task id `0..num_task` (0 means one
//! task per thread), each on its own thread at the same time, with `env.num_task` set, and
//! returns when all are done. Task 0 runs on the launching thread; tasks 1.. on the pool's
//! workers. A launch allocates nothing: it stores the lambda and bumps one atomic launch word
//! that idle workers watch. Consecutive kernels of one inference launch a few microseconds
//! apart, so an idle worker waits for the next launch actively for a bounded number of
//! iterations (CPU pause hints, then `sched_yield`; `MBLOB_THREAD_POOL_SPIN_COUNT` or TVM's
//! `TVM_THREAD_POOL_SPIN_COUNT` sets the yield count; 0 sleeps after the pause hints) and
//! only then sleeps on a condition variable, so an idle pool costs no CPU. Each launching thread has its own pool,
//! as in TVM, so two executors on two threads do not wait for each other.
//!
//! A task that fails sets its error on its own thread; the launcher gathers them and reports
//! `Task <i> error: <message>` lines as one error, returning -1. The barrier is real: a task
//! that calls it waits until every task of the launch has reached it.
//!
//! Threads: [`set_num_threads`] for the calling thread, else `MBLOB_NUM_THREADS`, else
//! `TVM_NUM_THREADS`, else the number of cores. With 1 thread every loop runs as one task on
//! the calling thread.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;

/// `TVMParallelGroupEnv`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct ParallelGroupEnv {
    /// Points to the launch's barrier.
    pub sync_handle: *mut c_void,
    /// The number of tasks of the launch.
    pub num_task: i32,
}

/// `FTVMParallelLambda`.
pub(crate) type ParallelLambda = unsafe extern "C" fn(c_int, *mut ParallelGroupEnv, *mut c_void) -> c_int;

/// Iterations a waiting thread spins with a CPU pause hint before it starts yielding its CPU.
const PAUSE_SPINS: u32 = 16;

/// Iterations (each one `sched_yield`) an idle worker waits for the next launch before it
/// sleeps, unless `MBLOB_THREAD_POOL_SPIN_COUNT` or `TVM_THREAD_POOL_SPIN_COUNT` says otherwise.
/// TVM's default is 300000; this one is smaller so that idle pools in a busy process (a test
/// suite with a pool per thread) give their CPU back sooner, and still far more than the gap
/// between two kernels of one inference.
const DEFAULT_SPIN_COUNT: u32 = 20_000;

/// The idle worker's spin budget (see [`DEFAULT_SPIN_COUNT`]).
fn spin_count() -> u32 {
    static COUNT: OnceLock<u32> = OnceLock::new();
    *COUNT.get_or_init(|| {
        ["MBLOB_THREAD_POOL_SPIN_COUNT", "TVM_THREAD_POOL_SPIN_COUNT"]
            .iter()
            .find_map(|k| std::env::var(k).ok()?.trim().parse::<u32>().ok())
            .unwrap_or(DEFAULT_SPIN_COUNT)
    })
}

/// One step of a bounded busy wait: a pause hint for the first [`PAUSE_SPINS`] iterations
/// (the other thread is usually running on another core and done within microseconds), then a
/// `sched_yield`, so that on a loaded machine the thread being waited for can run.
#[inline]
fn backoff(i: u32) {
    if i < PAUSE_SPINS {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// The most threads one pool has (the launch word keeps the task count in 16 bits).
const MAX_THREADS: usize = 1 << 12;

thread_local! {
    /// The calling thread's choice of thread count (0: the process default).
    static THREADS: Cell<usize> = const { Cell::new(0) };
    /// Set while this thread runs a task, so a nested launch runs inline.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
    static POOL: RefCell<Option<Pool>> = const { RefCell::new(None) };
}

/// A thread-count variable (`MBLOB_NUM_THREADS`, `TVM_NUM_THREADS`) that is not a whole
/// number of at least 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: expected a number of threads, at least 1 (unset it for one thread per core)")]
pub struct NumThreadsError {
    /// The variable.
    pub var: &'static str,
    /// Its value, as set.
    pub value: String,
}

/// The thread count the environment asks for: `MBLOB_NUM_THREADS`, else `TVM_NUM_THREADS`
/// (`None` when neither is set). A value that is not a whole number of at least 1 (`0`,
/// `abc`, `-2`) is an error, never a silent default.
pub fn env_num_threads() -> Result<Option<usize>, NumThreadsError> {
    for var in ["MBLOB_NUM_THREADS", "TVM_NUM_THREADS"] {
        let Some(value) = std::env::var_os(var) else { continue };
        let value = value.to_string_lossy().into_owned();
        return match value.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(NumThreadsError { var, value }),
        };
    }
    Ok(None)
}

/// The process default: `MBLOB_NUM_THREADS`, then `TVM_NUM_THREADS`, then the cores. A
/// malformed variable ([`env_num_threads`]'s error, which the `mblob` command line refuses)
/// is logged as a warning and taken as 1 thread, as TVM's runtime (`atoi`, then at least 1)
/// takes it.
pub(crate) fn default_num_threads() -> usize {
    static DEFAULT: OnceLock<usize> = OnceLock::new();
    *DEFAULT.get_or_init(|| match env_num_threads() {
        Ok(Some(n)) => n,
        Ok(None) => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        Err(e) => {
            tracing::warn!("{e}: using 1 thread");
            1
        }
    })
}

/// Sets how many threads parallel loops launched from the calling thread use (the calling
/// thread included); 0 restores the process default (`MBLOB_NUM_THREADS`, then
/// `TVM_NUM_THREADS`, then the number of cores).
pub fn set_num_threads(n: usize) {
    THREADS.with(|t| t.set(n));
}

/// The number of threads parallel loops launched from the calling thread use.
pub fn num_threads() -> usize {
    match THREADS.with(|t| t.get()) {
        0 => default_num_threads(),
        n => n,
    }
}

/// Keeps a value on its own cache line, so that the launcher's and the workers' hot atomics
/// do not bounce one line between cores.
#[repr(align(64))]
#[derive(Default)]
struct Line<T>(T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A barrier whose address is the group env's `sync_handle`.
#[derive(Default)]
struct SpinBarrier {
    arrived: Line<AtomicUsize>,
    generation: Line<AtomicUsize>,
}

/// State shared by a launching thread and its workers.
struct Shared {
    /// The launch word: a sequence number (bits 16..) and the launch's task count (bits
    /// 0..16). Workers wait for it to change; one load tells a worker whether it has a task,
    /// so a worker that lags behind can never take a task of a later launch for this one.
    word: Line<AtomicU64>,
    /// Tasks of the current launch not finished yet (task 0, run by the launcher, excluded).
    pending: Line<AtomicUsize>,
    lambda: AtomicUsize,
    cdata: AtomicUsize,
    /// Set when a task failed; `errors` is locked only then.
    has_error: AtomicBool,
    errors: Mutex<Vec<(usize, String)>>,
    barrier: SpinBarrier,
    env: std::cell::UnsafeCell<ParallelGroupEnv>,
    shutdown: AtomicBool,
    sleep: Mutex<()>,
    wake: Condvar,
    sleepers: AtomicUsize,
}

// SAFETY: `env` is written only by the launching thread before it publishes a launch (launch
// word store, SeqCst) and read by tasks after they observe it (Acquire), while no task of an
// earlier launch runs; all other fields are atomics or locks.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer in `env` is the address of `barrier`, owned by `Shared`.
unsafe impl Send for Shared {}

struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            word: Line(AtomicU64::new(0)),
            pending: Line(AtomicUsize::new(0)),
            lambda: AtomicUsize::new(0),
            cdata: AtomicUsize::new(0),
            has_error: AtomicBool::new(false),
            errors: Mutex::new(Vec::new()),
            barrier: SpinBarrier::default(),
            env: std::cell::UnsafeCell::new(ParallelGroupEnv { sync_handle: std::ptr::null_mut(), num_task: 0 }),
            shutdown: AtomicBool::new(false),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            sleepers: AtomicUsize::new(0),
        });
        // SAFETY: nothing else holds `shared` yet; the barrier's address is stable (inside
        // the `Arc`'s allocation) for the pool's lifetime.
        unsafe {
            (*shared.env.get()).sync_handle = (&shared.barrier as *const SpinBarrier).cast_mut().cast();
        }
        let cpus = binding_cpus();
        let workers = (1..threads.min(MAX_THREADS))
            .filter_map(|id| {
                let s = shared.clone();
                let cpu = (!cpus.is_empty()).then(|| cpus[id % cpus.len()]);
                std::thread::Builder::new()
                    .name(format!("mblob-worker-{id}"))
                    .spawn(move || {
                        if let Some(cpu) = cpu {
                            bind_to(cpu);
                        }
                        worker(&s, id)
                    })
                    .ok()
            })
            .collect();
        Pool { shared, workers }
    }

    /// Threads of this pool, the launching thread included.
    fn threads(&self) -> usize {
        self.workers.len() + 1
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The CPUs workers are bound to, in order (worker `k` to the `k`-th, modulo their count), as
/// TVM binds its workers: the CPUs the launching thread may run on, unless
/// `MBLOB_BIND_THREADS=0` (or `TVM_BIND_THREADS=0`); empty: no binding. The launching thread
/// itself stays free to move.
fn binding_cpus() -> Vec<usize> {
    let off = ["MBLOB_BIND_THREADS", "TVM_BIND_THREADS"]
        .iter()
        .find_map(|k| std::env::var(k).ok())
        .is_some_and(|v| v.trim() == "0");
    if off {
        return Vec::new();
    }
    // SAFETY: `set` is a plain bit set of the size passed; `sched_getaffinity(0, ..)` writes at
    // most that many bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// Binds the calling thread to one CPU (best effort: a failure leaves it free).
fn bind_to(cpu: usize) {
    // SAFETY: `set` is a zeroed bit set; `CPU_SET` writes inside it (`cpu` comes from
    // `binding_cpus`, below `CPU_SETSIZE`); `sched_setaffinity(0, ..)` only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Runs one task and records its error.
fn run_task(s: &Shared, task: usize) {
    let lambda = s.lambda.load(Ordering::Relaxed);
    let cdata = s.cdata.load(Ordering::Relaxed) as *mut c_void;
    // SAFETY: `lambda` was stored from a non-null `ParallelLambda` by `run_launch` before the
    // launch word was published (and read after it, Acquire); the env lives in `Shared` for
    // the pool's lifetime.
    let code = unsafe {
        let f: ParallelLambda = std::mem::transmute::<usize, ParallelLambda>(lambda);
        IN_TASK.with(|t| t.set(true));
        let code = f(task as c_int, s.env.get(), cdata);
        IN_TASK.with(|t| t.set(false));
        code
    };
    if code != 0 {
        let msg = crate::ffi::last_error::last_error();
        s.errors.lock().unwrap_or_else(|e| e.into_inner()).push((task, msg));
        s.has_error.store(true, Ordering::Release);
    }
}

fn worker(s: &Shared, id: usize) {
    let mut seen = 0u64;
    let budget = PAUSE_SPINS.saturating_add(spin_count());
    loop {
        // Wait for the next launch: spin (bounded), then sleep until woken.
        let mut i = 0u32;
        let word = loop {
            let w = s.word.load(Ordering::Acquire);
            if w != seen {
                break w;
            }
            if s.shutdown.load(Ordering::Relaxed) {
                return;
            }
            if i < budget {
                backoff(i);
                i += 1;
                continue;
            }
            let mut g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            while s.word.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst) {
                g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            i = 0;
        };
        seen = word;
        if id < (word & 0xffff) as usize {
            run_task(s, id);
            s.pending.fetch_sub(1, Ordering::Release);
        }
    }
}

/// `TVMBackendParallelLaunch`, as called from compiled code.
pub(crate) fn launch(lambda: Option<ParallelLambda>, cdata: *mut c_void, num_task: c_int) -> c_int {
    let Some(f) = lambda else {
        crate::ffi::last_error::set_last_error("TVMBackendParallelLaunch: the parallel lambda is null");
        return -1;
    };
    let threads = num_threads().min(MAX_THREADS);
    // One thread, or a launch from inside a task: one task covering the whole loop, here.
    if threads <= 1 || IN_TASK.with(|t| t.get()) {
        let barrier = SpinBarrier::default();
        let mut env = ParallelGroupEnv { sync_handle: (&barrier as *const SpinBarrier).cast_mut().cast(), num_task: 1 };
        // SAFETY: compiled code passes a lambda of this signature; `env` and its barrier live
        // until the call returns.
        return unsafe { f(0, &mut env, cdata) };
    }
    let requested = if num_task <= 0 { threads } else { num_task as usize };
    if requested > threads {
        crate::ffi::last_error::set_last_error(&format!(
            "Request parallel sync task larger than number of threads used workers={threads} request={requested}"
        ));
        return -1;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        if p.as_ref().is_none_or(|pool| pool.threads() != threads) {
            *p = None;
            *p = Some(Pool::new(threads));
        }
        let pool = p.as_ref().expect("just created");
        if requested > pool.threads() {
            crate::ffi::last_error::set_last_error(&format!(
                "cannot start {} worker threads for a parallel launch of {requested} tasks",
                threads - 1
            ));
            return -1;
        }
        run_launch(&pool.shared, f, cdata, requested)
    })
}

/// Publishes one launch of `n` tasks, runs task 0 here, and waits for the others. Allocates
/// nothing unless a task fails.
fn run_launch(s: &Shared, f: ParallelLambda, cdata: *mut c_void, n: usize) -> c_int {
    s.barrier.arrived.store(0, Ordering::Relaxed);
    // SAFETY: no task of a previous launch runs any more (we waited for them), so this thread
    // is the only one touching `env` until the launch word below publishes it.
    unsafe {
        (*s.env.get()).num_task = n as i32;
    }
    s.lambda.store(f as usize, Ordering::Relaxed);
    s.cdata.store(cdata as usize, Ordering::Relaxed);
    s.pending.store(n - 1, Ordering::Relaxed);
    let seq = (s.word.load(Ordering::Relaxed) >> 16).wrapping_add(1);
    s.word.store((seq << 16) | n as u64, Ordering::SeqCst);
    if s.sleepers.load(Ordering::SeqCst) > 0 {
        let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
        s.wake.notify_all();
    }
    run_task(s, 0);
    let mut i = 0u32;
    while s.pending.load(Ordering::Acquire) != 0 {
        backoff(i);
        i = i.saturating_add(1);
    }
    if !s.has_error.load(Ordering::Acquire) {
        return 0;
    }
    s.has_error.store(false, Ordering::Relaxed);
    let mut errors = s.errors.lock().unwrap_or_else(|e| e.into_inner());
    errors.sort_by_key(|(task, _)| *task);
    let text: String = errors.iter().map(|(task, msg)| format!("Task {task} error: {msg}\n")).collect();
    errors.clear();
    drop(errors);
    crate::ffi::last_error::set_last_error(&text);
    -1
}

/// `TVMBackendParallelBarrier`: waits until all `env.num_task` tasks have arrived.
pub(crate) fn barrier(_task_id: c_int, env: *mut ParallelGroupEnv) -> c_int {
    if env.is_null() {
        return 0;
    }
    // SAFETY: compiled code passes the env it received from `launch`, whose `sync_handle` is a
    // `SpinBarrier` that outlives the launch.
    let (n, b) = unsafe {
        let env = &*env;
        if env.sync_handle.is_null() {
            return 0;
        }
        (env.num_task.max(1) as usize, &*(env.sync_handle as *const SpinBarrier))
    };
    let generation = b.generation.load(Ordering::Acquire);
    if b.arrived.fetch_add(1, Ordering::AcqRel) + 1 == n {
        b.arrived.store(0, Ordering::Relaxed);
        b.generation.fetch_add(1, Ordering::AcqRel);
    } else {
        let mut i = 0u32;
        while b.generation.load(Ordering::Acquire) == generation {
            backoff(i);
            i = i.saturating_add(1);
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI32;

    struct Probe {
        ran: Vec<AtomicUsize>,
        threads: Mutex<Vec<std::thread::ThreadId>>,
        num_task: AtomicI32,
        before: AtomicUsize,
        after_ok: AtomicBool,
        fail: Option<usize>,
    }

    unsafe extern "C" fn lambda(task: c_int, env: *mut ParallelGroupEnv, cdata: *mut c_void) -> c_int {
        // SAFETY: `cdata` is the test's `Probe`, alive for the launch; `env` is the launch's.
        let (p, env_ref) = unsafe { (&*(cdata as *const Probe), &*env) };
        p.ran[task as usize].fetch_add(1, Ordering::SeqCst);
        p.num_task.store(env_ref.num_task, Ordering::SeqCst);
        p.threads.lock().unwrap().push(std::thread::current().id());
        p.before.fetch_add(1, Ordering::SeqCst);
        barrier(task, env);
        // After the barrier every task has arrived.
        if p.before.load(Ordering::SeqCst) != env_ref.num_task as usize {
            p.after_ok.store(false, Ordering::SeqCst);
        }
        if p.fail == Some(task as usize) {
            crate::ffi::last_error::set_last_error("boom");
            return -1;
        }
        0
    }

    fn probe(n: usize, fail: Option<usize>) -> Probe {
        Probe {
            ran: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            threads: Mutex::new(Vec::new()),
            num_task: AtomicI32::new(0),
            before: AtomicUsize::new(0),
            after_ok: AtomicBool::new(true),
            fail,
        }
    }

    #[test]
    fn tasks_run_once_each_on_their_own_threads_with_a_real_barrier() {
        set_num_threads(4);
        for requested in [0, 3, 4] {
            let p = probe(4, None);
            assert_eq!(launch(Some(lambda), (&p as *const Probe).cast_mut().cast(), requested), 0);
            let n = if requested == 0 { 4 } else { requested as usize };
            assert_eq!(p.num_task.load(Ordering::SeqCst), n as i32);
            for (i, r) in p.ran.iter().enumerate() {
                assert_eq!(r.load(Ordering::SeqCst), usize::from(i < n), "task {i} of {n}");
            }
            let mut ids = p.threads.lock().unwrap().clone();
            ids.sort_by_key(|t| format!("{t:?}"));
            ids.dedup();
            assert_eq!(ids.len(), n, "each task on its own thread");
            assert!(p.after_ok.load(Ordering::SeqCst), "the barrier waited for every task");
        }
        // More tasks than threads: TVM's error.
        let p = probe(8, None);
        assert_eq!(launch(Some(lambda), (&p as *const Probe).cast_mut().cast(), 8), -1);
        assert!(crate::ffi::last_error::last_error().contains("workers=4 request=8"));
        set_num_threads(0);
    }

    #[test]
    fn errors_set_on_worker_threads_reach_the_launcher() {
        set_num_threads(3);
        let p = probe(3, Some(2));
        assert_eq!(launch(Some(lambda), (&p as *const Probe).cast_mut().cast(), 0), -1);
        assert_eq!(crate::ffi::last_error::last_error(), "Task 2 error: boom\n");
        // The pool still works after a failed launch.
        let p = probe(3, None);
        assert_eq!(launch(Some(lambda), (&p as *const Probe).cast_mut().cast(), 0), 0);
        set_num_threads(0);
    }

    #[test]
    fn one_thread_runs_one_task_on_the_caller() {
        set_num_threads(1);
        let p = probe(4, None);
        assert_eq!(launch(Some(lambda), (&p as *const Probe).cast_mut().cast(), 0), 0);
        assert_eq!(p.num_task.load(Ordering::SeqCst), 1);
        assert_eq!(*p.threads.lock().unwrap(), vec![std::thread::current().id()]);
        assert_eq!(launch(None, std::ptr::null_mut(), 0), -1);
        set_num_threads(0);
    }

    unsafe extern "C" fn nested(task: c_int, _env: *mut ParallelGroupEnv, cdata: *mut c_void) -> c_int {
        // SAFETY: `cdata` is the test's `Probe`, alive for the launch.
        let p = unsafe { &*(cdata as *const Probe) };
        p.before.fetch_add(1, Ordering::SeqCst);
        // A launch from inside a task runs inline, as one task.
        let inner = probe(4, None);
        if launch(Some(lambda), (&inner as *const Probe).cast_mut().cast(), 0) != 0
            || inner.num_task.load(Ordering::SeqCst) != 1
            || inner.ran[0].load(Ordering::SeqCst) != 1
        {
            return -1;
        }
        p.ran[task as usize].fetch_add(1, Ordering::SeqCst);
        0
    }

    #[test]
    fn launches_from_several_threads_and_nested_launches_each_complete() {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                std::thread::spawn(|| {
                    set_num_threads(2);
                    for _ in 0..300 {
                        let p = probe(2, None);
                        assert_eq!(launch(Some(lambda), (&p as *const Probe).cast_mut().cast(), 0), 0);
                        assert!(p.ran.iter().all(|r| r.load(Ordering::SeqCst) == 1));
                        assert!(p.after_ok.load(Ordering::SeqCst));
                    }
                    let p = probe(2, None);
                    assert_eq!(launch(Some(nested), (&p as *const Probe).cast_mut().cast(), 0), 0);
                    assert!(p.ran.iter().all(|r| r.load(Ordering::SeqCst) == 1));
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
