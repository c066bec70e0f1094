//! TVM's RNN state (`relax.vm.RNNStateImp`, TVM 0.27's `src/runtime/vm/rnn_state.cc`): the
//! per-sequence states of a space-state model (RWKV's token-shift vectors and WKV matrices,
//! the recurrent layers of a hybrid model), kept with a short history so that a sequence can
//! roll back, and the `vm.builtin.rnn_state_*` builtins the compiled code calls on it.
//!
//! A model library made as MLC-LLM makes them has a VM function `create_rnn_state(
//! [max_batch_size], [max_history])` that calls `vm.builtin.rnn_state_create` with the number
//! of layers, the two sizes, the library's get and set kernels (one of each per state of a
//! layer) and each state's initial value. The storage of state `s` of layer `l` is one tensor
//! `[reserved_num_seqs, max_history, *shape_s]` on the device of the initial values; a sequence
//! owns one slot of the first axis, and its current state is at its history slot. Each round
//! (`kv_state_begin_forward`) the sequences' slot ids and history slot ids go to the device;
//! the model's `rnn_state_get` copies the current states of the round's sequences out
//! (`f_get(storage, seq_slot_ids, history_slot_ids, out)`) and `rnn_state_set` writes the new
//! ones into the next history slot (`f_set(storage, seq_slot_ids, history_slot_ids, data)`);
//! `kv_state_end_forward` then moves every sequence of the round on by one slot. A decode
//! step (one token) adds one step of history (at most `max_history - 1`), a prefill of several
//! tokens leaves none, and `kv_state_popn(seq, n)` goes back `n` steps within it.
//!
//! The generic `vm.builtin.kv_state_*` builtins (clear, add/remove/fork a sequence, popn,
//! begin/end forward) serve an RNN state here and a paged KV cache in [`super::kv_cache`]:
//! this module's builtin table comes first in the builtin set and hands every other object on
//! to the cache's.
//! TVM's checks fail with TVM's messages ([`RnnStateError::Check`]).

mod builtins;
mod error;

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

pub(crate) use builtins::TABLE;
pub use error::RnnStateError;

use crate::array::NdArray;
use crate::device::Device;
use crate::exec::relax::vm::call_kernel;
use crate::exec::relax::vm::value::{Value, VmError, VmObject};
use crate::ffi::call::PackedFunction;
use crate::format::DataType;
use crate::module::LoadedTree;

/// TVM's type key of the state.
pub const TYPE_KEY: &str = "relax.vm.RNNStateImp";

/// A get or set kernel of the library, with its name (for errors).
#[derive(Debug, Clone)]
pub(crate) struct Accessor {
    pub name: String,
    pub f: PackedFunction,
}

/// A sequence of the state (TVM's `RNNStateImpObj::Sequence`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sequence {
    /// Tokens forwarded so far.
    pub seq_length: i64,
    /// How many steps `popn` may go back.
    pub available_history_num: i64,
    /// Where its current state is along the history axis.
    pub history_slot_id: i64,
    /// Its slot along the first axis of the storages.
    pub seq_slot_id: i64,
}

/// What changes: the sequences, the free slots and the current round.
#[derive(Debug, Default)]
struct Table {
    seqs: HashMap<i64, Sequence>,
    /// Slots given back (by removed sequences), the last one taken first; then the slots never
    /// used, from `next_unused` up: TVM's free list, which starts as every slot from the last
    /// down (slot 0 taken first) and takes and returns slots at its end.
    released: Vec<i64>,
    next_unused: i64,
    cur_seq_ids: Vec<i64>,
    cur_append_lengths: Vec<i64>,
    /// Whether the device's slot arrays are behind the table (TVM's `dirty_aux_data_device_`).
    dirty: bool,
    /// The round's slot ids and history slot ids on the device (views of the first
    /// `cur_seq_ids.len()` entries), once a round synchronised them.
    views: Option<(NdArray, NdArray)>,
}

/// TVM's `RNNStateImp`, on the device of its initial values. Shared between the VM's
/// registers and the host (an `ObjectRef`); its methods lock it.
#[derive(Debug)]
pub struct RnnState {
    num_layers: i64,
    reserved_num_seqs: i64,
    max_history: i64,
    gets: Vec<Accessor>,
    sets: Vec<Accessor>,
    init: Vec<NdArray>,
    /// Per layer, per state: `[reserved_num_seqs, max_history, *state shape]`.
    storages: Vec<Vec<NdArray>>,
    /// `[reserved_num_seqs]` int32 each, on the device.
    seq_slot_ids: NdArray,
    history_slot_ids: NdArray,
    table: Mutex<Table>,
    /// Keeps the library of the kernels loaded.
    _tree: LoadedTree,
}

impl VmObject for RnnState {
    fn type_key(&self) -> &'static str {
        TYPE_KEY
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The most bytes of storage mblob allocates for a state (TVM would try; mblob refuses rather
/// than abort).
const MAX_STORAGE_BYTES: u64 = 1 << 40;

impl RnnState {
    /// TVM's constructor: the storages allocated (not initialised: a sequence's slot gets the
    /// initial values when it is added), every slot free.
    pub(crate) fn new(
        num_layers: i64,
        reserved_num_seqs: i64,
        max_history: i64,
        gets: Vec<Accessor>,
        sets: Vec<Accessor>,
        init: Vec<NdArray>,
        tree: LoadedTree,
    ) -> Result<RnnState, VmError> {
        let device = init[0].device();
        let mut total: u64 = 0;
        let mut storages = Vec::new();
        for _ in 0..num_layers {
            let mut layer = Vec::with_capacity(init.len());
            for value in &init {
                let mut shape = vec![reserved_num_seqs, max_history];
                shape.extend_from_slice(value.shape());
                let bytes = crate::array::tensor_bytes(value.dtype(), &shape).ok_or(VmError::Alloc(u64::MAX))?;
                total = total.saturating_add(bytes);
                if total > MAX_STORAGE_BYTES {
                    return Err(VmError::Alloc(total));
                }
                layer.push(NdArray::empty(&shape, value.dtype(), device)?);
            }
            storages.push(layer);
        }
        if max_history <= 0 {
            return Err(RnnStateError::compare(
                "max_history_ > 0",
                max_history,
                0,
                "At least 1 history slot to store the current state",
            )
            .into());
        }
        let seq_slot_ids = NdArray::empty(&[reserved_num_seqs], DataType::I32, device)?;
        let history_slot_ids = NdArray::empty(&[reserved_num_seqs], DataType::I32, device)?;
        let table = Table::default();
        Ok(RnnState {
            num_layers,
            reserved_num_seqs,
            max_history,
            gets,
            sets,
            init,
            storages,
            seq_slot_ids,
            history_slot_ids,
            table: Mutex::new(table),
            _tree: tree,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The number of layers.
    pub fn num_layers(&self) -> i64 {
        self.num_layers
    }

    /// The number of sequence slots.
    pub fn reserved_num_seqs(&self) -> i64 {
        self.reserved_num_seqs
    }

    /// The history slots per sequence.
    pub fn max_history(&self) -> i64 {
        self.max_history
    }

    /// The device of the storages.
    pub fn device(&self) -> Device {
        self.seq_slot_ids.device()
    }

    /// A sequence's bookkeeping, when the state holds it.
    pub fn sequence(&self, seq_id: i64) -> Option<Sequence> {
        self.lock().seqs.get(&seq_id).copied()
    }

    /// Drops every sequence (TVM's `Clear`).
    pub fn clear(&self) {
        let mut t = self.lock();
        t.seqs.clear();
        t.released.clear();
        t.next_unused = 0;
        t.dirty = false;
    }

    /// The bytes of one history step of state `state_id` of a layer, and of a sequence's slot.
    fn sizes(&self, state_id: usize) -> (usize, usize) {
        let step = self.init[state_id].nbytes();
        (step, step * self.max_history as usize)
    }

    /// `f(storage, initial value, bytes of a sequence's slot)` for every state of every layer.
    fn each_storage(
        &self,
        mut f: impl FnMut(&NdArray, &NdArray, usize) -> Result<(), crate::device::DeviceError>,
    ) -> Result<(), VmError> {
        for layer in &self.storages {
            for (sid, storage) in layer.iter().enumerate() {
                f(storage, &self.init[sid], self.sizes(sid).1)?;
            }
        }
        Ok(())
    }

    /// Adds a sequence, its state the initial values at history slot 0.
    pub fn add_sequence(&self, seq_id: i64) -> Result<(), VmError> {
        let mut t = self.lock();
        absent(&t, seq_id, "seq_id", "sequence")?;
        let slot = free_slot(&mut t, self.reserved_num_seqs)?;
        t.seqs.insert(
            seq_id,
            Sequence { seq_length: 0, available_history_num: 0, history_slot_id: 0, seq_slot_id: slot },
        );
        self.each_storage(|storage, init, per_seq| {
            init.storage().copy_to(0, storage.storage(), slot as usize * per_seq, init.nbytes())
        })?;
        t.dirty = true;
        Ok(())
    }

    /// Removes a sequence, freeing its slot.
    pub fn remove_sequence(&self, seq_id: i64) -> Result<(), VmError> {
        let mut t = self.lock();
        let seq = t.seqs.remove(&seq_id).ok_or_else(|| RnnStateError::unknown(seq_id, "in the space state storage"))?;
        t.released.push(seq.seq_slot_id);
        t.dirty = true;
        Ok(())
    }

    /// Forks `child_id` off `parent_id`: the child gets a slot of its own with a copy of every
    /// history step of the parent's, and the parent's bookkeeping (TVM ignores `fork_pos`).
    pub fn fork_sequence(&self, parent_id: i64, child_id: i64) -> Result<(), VmError> {
        let mut t = self.lock();
        let parent = *t.seqs.get(&parent_id).ok_or_else(|| {
            RnnStateError::unless(
                "parent_it != seq_map_.end()",
                format!("The parent sequence \"{parent_id}\" cannot be found in space state storage."),
            )
        })?;
        absent(&t, child_id, "child_seq_id", "child sequence")?;
        let slot = free_slot(&mut t, self.reserved_num_seqs)?;
        t.seqs.insert(child_id, Sequence { seq_slot_id: slot, ..parent });
        let from = parent.seq_slot_id as usize;
        self.each_storage(|storage, _, per_seq| {
            let s = storage.storage();
            s.copy_to(from * per_seq, s, slot as usize * per_seq, per_seq)
        })?;
        t.dirty = true;
        Ok(())
    }

    /// Rolls a sequence back `n` steps (at most its available history).
    pub fn popn(&self, seq_id: i64, n: i64) -> Result<(), VmError> {
        let mut t = self.lock();
        let max_history = self.max_history;
        let seq = t.seqs.get_mut(&seq_id).ok_or_else(|| RnnStateError::unknown(seq_id, "in space state"))?;
        // TVM takes `n` as an int32.
        let n = n as i32 as i64;
        if n < 0 {
            return Err(RnnStateError::compare(
                "n >= 0",
                n,
                0,
                format!("The length of rolling back {n} cannot be negative."),
            )
            .into());
        }
        if n > seq.available_history_num {
            return Err(RnnStateError::compare(
                "n <= it->second.available_history_num",
                n,
                seq.available_history_num,
                format!(
                    "The sequence only has {} available history in the space state storage, while the length of \
                     rollback is {n} which exceeds the sequence length.",
                    seq.available_history_num
                ),
            )
            .into());
        }
        seq.seq_length -= n;
        seq.available_history_num -= n;
        seq.history_slot_id = (seq.history_slot_id - n + max_history) % max_history;
        t.dirty = true;
        Ok(())
    }

    /// Starts a round: the sequences and how many tokens each appends. The slot arrays go to
    /// the device when the table changed since the last round.
    pub fn begin_forward(&self, seq_ids: &[i64], append_lengths: &[i64]) -> Result<(), VmError> {
        let _span = tracing::debug_span!("rnn_state_begin_forward", batch = seq_ids.len()).entered();
        if seq_ids.len() != append_lengths.len() {
            return Err(RnnStateError::compare(
                "seq_ids.size() == append_lengths.size()",
                seq_ids.len(),
                append_lengths.len(),
                format!(
                    "The seq_ids size ({}) and append_lengths size ({}) mismatch.",
                    seq_ids.len(),
                    append_lengths.len()
                ),
            )
            .into());
        }
        let mut t = self.lock();
        t.cur_seq_ids = seq_ids.to_vec();
        t.cur_append_lengths = append_lengths.to_vec();
        if t.dirty {
            self.sync(&mut t)?;
        }
        Ok(())
    }

    /// TVM's `SyncAuxArrayToDevice`: the round's slot ids and history slot ids, copied to the
    /// device.
    fn sync(&self, t: &mut Table) -> Result<(), VmError> {
        let mut slots = Vec::with_capacity(t.cur_seq_ids.len() * 4);
        let mut history = Vec::with_capacity(t.cur_seq_ids.len() * 4);
        for id in &t.cur_seq_ids {
            let seq = t.seqs.get(id).ok_or_else(|| RnnStateError::unknown(*id, "in the space state storage"))?;
            slots.extend_from_slice(&(seq.seq_slot_id as i32).to_le_bytes());
            history.extend_from_slice(&(seq.history_slot_id as i32).to_le_bytes());
        }
        let n = t.cur_seq_ids.len() as i64;
        if n > self.reserved_num_seqs {
            return Err(VmError::Device(crate::device::DeviceError::OutOfBounds {
                device: self.device(),
                what: "view",
                offset: 0,
                end: n as u64 * 4,
                size: self.reserved_num_seqs as u64 * 4,
            }));
        }
        let slot_view = self.seq_slot_ids.view(&[n], DataType::I32)?;
        let history_view = self.history_slot_ids.view(&[n], DataType::I32)?;
        slot_view.copy_from_bytes(&slots)?;
        history_view.copy_from_bytes(&history)?;
        t.views = Some((slot_view, history_view));
        t.dirty = false;
        Ok(())
    }

    /// Ends a round: each sequence of it moves on one history slot.
    pub fn end_forward(&self) -> Result<(), VmError> {
        let mut t = self.lock();
        let max_history = self.max_history;
        let round: Vec<(i64, i64)> = t.cur_seq_ids.iter().copied().zip(t.cur_append_lengths.iter().copied()).collect();
        for (id, length) in round {
            let seq = t.seqs.get_mut(&id).ok_or_else(|| RnnStateError::unknown(id, "in the space state storage"))?;
            // As TVM's int64 arithmetic, without a panic on absurd lengths.
            seq.seq_length = seq.seq_length.wrapping_add(length);
            seq.available_history_num =
                if length > 1 { 0 } else { (seq.available_history_num + 1).min(max_history - 1) };
            seq.history_slot_id = (seq.history_slot_id + 1) % max_history;
        }
        t.dirty = true;
        Ok(())
    }

    /// The round's slot arrays, after TVM's checks of `Get` and `Set`.
    fn round(&self, what: &str) -> Result<(NdArray, NdArray), VmError> {
        let t = self.lock();
        if t.dirty {
            return Err(RnnStateError::unless(
                "!dirty_aux_data_device_",
                format!(
                    "The auxiliary arrays are not synchronized to device. Please call `BeginForward` to synchronize \
                     before calling `{what}`."
                ),
            )
            .into());
        }
        match &t.views {
            Some((slots, history)) if !t.cur_seq_ids.is_empty() => Ok((slots.clone(), history.clone())),
            _ => Err(RnnStateError::compare(
                "cur_batch_size_ > 0",
                0,
                0,
                "The curent batch size should be greater than 0.",
            )
            .into()),
        }
    }

    /// The storage of a state of a layer, the ids checked.
    fn storage(&self, builtin: &str, layer_id: i64, state_id: i64) -> Result<&NdArray, VmError> {
        let arg = |index, detail: String| RnnStateError::Arg { builtin: builtin.to_owned(), index, detail };
        let layer = usize::try_from(layer_id)
            .ok()
            .and_then(|l| self.storages.get(l))
            .ok_or_else(|| arg(1, format!("layer {layer_id} of a state of {} layers", self.num_layers)))?;
        let storage = usize::try_from(state_id)
            .ok()
            .and_then(|s| layer.get(s))
            .ok_or_else(|| arg(2, format!("state {state_id} of a layer of {} states", self.init.len())))?;
        Ok(storage)
    }

    /// `rnn_state_get`: the current states `state_id` of layer `layer_id` of the round's
    /// sequences into `out` (`[batch, *shape]`), by the library's get kernel.
    pub fn get(&self, layer_id: i64, state_id: i64, out: &NdArray) -> Result<(), VmError> {
        self.access("Get", layer_id, state_id, out)
    }

    /// `rnn_state_set`: the new states `state_id` of layer `layer_id` of the round's sequences
    /// (`data`, `[batch, *shape]`) into their next history slots, by the library's set kernel.
    pub fn set(&self, layer_id: i64, state_id: i64, data: &NdArray) -> Result<(), VmError> {
        self.access("Set", layer_id, state_id, data)
    }

    /// `Get` or `Set`: the library's kernel of the state over its storage, the round's slot
    /// arrays and `tensor`.
    fn access(&self, what: &str, layer_id: i64, state_id: i64, tensor: &NdArray) -> Result<(), VmError> {
        let (slots, history) = self.round(what)?;
        let (builtin, kernels) = if what == "Get" {
            ("vm.builtin.rnn_state_get", &self.gets)
        } else {
            ("vm.builtin.rnn_state_set", &self.sets)
        };
        let storage = self.storage(builtin, layer_id, state_id)?;
        let k = &kernels[state_id as usize];
        let args = [
            Value::Tensor(storage.clone()),
            Value::Tensor(slots),
            Value::Tensor(history),
            Value::Tensor(tensor.clone()),
        ];
        let refs: Vec<&Value> = args.iter().collect();
        call_kernel(&k.name, &k.f, &refs)?;
        Ok(())
    }

    /// `rnn_state_debug_get`: a copy of a sequence's current state `state_id` of layer
    /// `layer_id`.
    pub fn debug_get(&self, layer_id: i64, state_id: i64, seq_id: i64) -> Result<NdArray, VmError> {
        let seq = self.sequence(seq_id).ok_or_else(|| RnnStateError::unknown(seq_id, "in the space state storage"))?;
        let storage = self.storage("vm.builtin.rnn_state_debug_get", layer_id, state_id)?;
        let value = &self.init[state_id as usize];
        let (step, per_seq) = self.sizes(state_id as usize);
        let out = NdArray::empty(value.shape(), value.dtype(), self.device())?;
        let from = seq.seq_slot_id as usize * per_seq + seq.history_slot_id as usize * step;
        storage.storage().copy_to(from, out.storage(), 0, step)?;
        Ok(out)
    }
}

/// TVM's check that the state does not hold `seq_id` yet (`var`: its name in TVM's check,
/// `what`: in its message).
fn absent(t: &Table, seq_id: i64, var: &str, what: &str) -> Result<(), RnnStateError> {
    if t.seqs.contains_key(&seq_id) {
        return Err(RnnStateError::unless(
            &format!("seq_map_.find({var}) == seq_map_.end()"),
            format!("The {what} \"{seq_id}\" is already in the space state storage."),
        ));
    }
    Ok(())
}

/// TVM's `GetFreeSlot`, of `reserved` slots.
fn free_slot(t: &mut Table, reserved: i64) -> Result<i64, RnnStateError> {
    if let Some(slot) = t.released.pop() {
        return Ok(slot);
    }
    if t.next_unused < reserved {
        t.next_unused += 1;
        return Ok(t.next_unused - 1);
    }
    Err(RnnStateError::unless("!free_slot_ids_.empty()", "The Sequence slot is full, cannot accept new sequence."))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slots `free_slot` hands out are those of TVM's free list (a vector filled with every
    /// slot from the last down, taken from and returned to its end), over a run of adds and
    /// removes.
    #[test]
    fn slots_come_in_the_order_of_tvms_free_list() {
        let reserved = 5;
        let mut tvm: Vec<i64> = (0..reserved).rev().collect();
        let mut t = Table::default();
        let mut held: Vec<i64> = Vec::new();
        // Take 3, give back the 2nd and 1st, take 4 (2 reused, 2 new), give back all but one,
        // take until full and one more.
        let script: &[i64] = &[1, 1, 1, -2, -1, 1, 1, 1, 1, -1, -2, -3, -4, 1, 1, 1, 1, 1];
        for &op in script {
            if op > 0 {
                let want = tvm.pop();
                let got = free_slot(&mut t, reserved).ok();
                assert_eq!(got, want);
                held.extend(got);
            } else {
                let slot = held.remove((-op - 1) as usize % held.len());
                tvm.push(slot);
                t.released.push(slot);
            }
        }
        assert!(free_slot(&mut t, reserved).is_err());
    }
}
